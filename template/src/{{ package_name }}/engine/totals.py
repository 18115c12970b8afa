"""What a recipe reports per batch, summed over batches and then over ranks in float64."""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from .process_group import reduction_device


class Totals:
    """Per-batch `means` (weighted by samples) and `sums`, folded in fp64 when asked or every 1024: no sync a batch."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.folded: dict[str, torch.Tensor] = {}
        self.samples = torch.zeros((), dtype=torch.float64, device=device)
        self.waiting: list[tuple[int, dict, dict]] = []
        self.batches = 0  # added so far, folded
        self.first_nonfinite = None  # the first batch whose loss was NaN or infinite (a tensor: found without a sync)

    def add(self, samples: int, means: dict, sums: dict) -> None:
        self.waiting.append((samples, means, sums))
        if len(self.waiting) == 1024:
            self.fold()

    def fold(self) -> dict[str, torch.Tensor]:
        """{name: sum so far} (a mean times its batch's samples); `self.samples` the samples so far."""
        if self.waiting:
            counts = torch.tensor([batch[0] for batch in self.waiting], dtype=torch.float64, device=self.device)
            for position, weighted in ((1, True), (2, False)):
                for name in self.waiting[0][position]:
                    # Tensors of one shape, or Python numbers; on the two devices of a split model, brought to one.
                    values = [torch.as_tensor(batch[position][name]).to(self.device) for batch in self.waiting]
                    values = torch.stack(values).double()
                    if weighted and name == "loss":
                        bad = ~torch.isfinite(values)
                        none = torch.tensor(torch.iinfo(torch.int64).max, device=values.device)
                        first = torch.where(bad.any(), self.batches + bad.long().argmax(), none)
                        earlier = self.first_nonfinite
                        self.first_nonfinite = first if earlier is None else torch.minimum(earlier, first)
                    self.folded[name] = self.folded.get(name, 0) + (values @ counts if weighted else values.sum(0))
            self.samples += counts.sum()
            self.batches += len(self.waiting)
            self.waiting = []
        return self.folded

    def state_dict(self) -> dict:
        """The sums so far as CPU tensors: a resumed epoch's row is then the uninterrupted one's, folded alike."""
        sums = {name: value.cpu() for name, value in self.fold().items()}
        return {"sums": sums, "samples": self.samples.cpu(), "batches": self.batches}

    def load_state_dict(self, saved: dict) -> None:
        self.folded = {name: value.to(self.device) for name, value in saved["sums"].items()}
        self.samples, self.waiting = saved["samples"].to(self.device), []
        self.batches = saved.get("batches", 0)


def all_reduced(totals: list[Totals]) -> list[tuple[dict[str, torch.Tensor], float]]:
    """[({name: sum}, samples), ...] over all ranks in one fp64 sum (gloo cannot AVG, nor bf16), names gathered first:
    a rank may have had no validation batch."""
    layouts: list = [None] * dist.get_world_size()
    shapes = [[(name, tuple(value.shape)) for name, value in part.fold().items()] for part in totals]
    dist.all_gather_object(layouts, shapes)
    merged = [dict(kv for layout in layouts for kv in layout[index]) for index in range(len(totals))]
    device, pieces = totals[0].device, []
    for part, names in zip(totals, merged):
        for name, shape in names.items():
            value = part.folded.get(name)
            pieces.append(value.reshape(-1) if value is not None else torch.zeros(math.prod(shape), device=device))
        pieces.append(part.samples.reshape(1))
    flat = torch.cat([piece.double() for piece in pieces]).to(reduction_device(device))
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    results, start = [], 0
    for names in merged:
        sums = {}
        for name, shape in names.items():
            sums[name] = flat[start : start + math.prod(shape)].reshape(shape).cpu()
            start += math.prod(shape)
        results.append((sums, float(flat[start])))
        start += 1
    return results


def validation_metrics(recipe, sums: dict[str, torch.Tensor], samples: float) -> dict[str, float]:
    """Each scalar sum per sample (the loss, metric()'s count), then what the recipe's metrics(sums) computes."""
    values = {name: float(total) / max(samples, 1) for name, total in sums.items() if total.dim() == 0}
    if hasattr(recipe, "metrics"):  # from the global sums: exact for any world size and batch size
        found = recipe.metrics({**sums, "samples": torch.tensor(samples, dtype=torch.float64)})
        values.update({name: float(value) for name, value in found.items()})
    return values
