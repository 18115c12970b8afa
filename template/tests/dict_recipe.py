"""A recipe with HuggingFace-style batches, for the tests: {"input_ids", "attention_mask", "labels"}, model(**batch).

The Dataset returns a dict per sample (the DataLoader collates them into a dict of tensors); the model takes
the batch's entries as keyword arguments and returns a dict with the loss and the logits, as a transformers
model does. training_step is the whole contract: the engine moves the dict to the device and counts its samples.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import Dataset

VOCAB, LENGTH, CLASSES = 16, 8, 2
TRAINING_SAMPLES, VALIDATION_SAMPLES = 256, 61


class Sentences(Dataset):
    """Token sequences with padding; the label says whether token 3 occurs in the unpadded part."""

    def __init__(self, count: int, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        self.tokens = torch.randint(1, VOCAB, (count, LENGTH), generator=generator)
        lengths = torch.randint(2, LENGTH + 1, (count,), generator=generator)
        self.mask = (torch.arange(LENGTH)[None, :] < lengths[:, None]).long()
        self.tokens = self.tokens * self.mask  # 0 is the padding token
        self.labels = ((self.tokens == 3) & (self.mask == 1)).any(dim=1).long()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> dict:
        return {"input_ids": self.tokens[index], "attention_mask": self.mask[index], "labels": self.labels[index]}


class BagOfTokens(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, 16)
        self.head = nn.Linear(16, CLASSES)

    def forward(self, input_ids, attention_mask, labels=None) -> dict:
        weights = attention_mask.unsqueeze(-1).float()
        pooled = (self.embedding(input_ids) * weights).sum(dim=1) / weights.sum(dim=1)
        logits = self.head(pooled)
        loss = nn.functional.cross_entropy(logits.float(), labels) if labels is not None else None
        return {"loss": loss, "logits": logits}


def datasets(config):
    return Sentences(TRAINING_SAMPLES, config.seed), Sentences(VALIDATION_SAMPLES, config.seed + 1)


def model(config, devices):
    return BagOfTokens().to(devices[0])


def optimizer(model, config):
    return torch.optim.Adam(model.parameters(), lr=0.1)


def schedule(optimizer, config, total_steps):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


def training_step(model, batch):
    outputs = model(**batch)
    correct = (outputs["logits"].argmax(dim=1) == batch["labels"]).float().mean()
    return outputs["loss"], {"accuracy": correct}
