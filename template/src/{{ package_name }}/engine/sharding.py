"""Sharded data parallel (parallelism = "fsdp"): the model wrapped with FSDP2's fully_shard, and its state whole.

Config.problems refuses GPUs over gloo: FSDP2's reduce-scatter reaches gloo's allreduce, which the Windows builds of
torch lack for CUDA tensors (pytorch/pytorch#186535), and on the CPU it moves as many bytes as an all-reduce (fsdp
there saves memory, not communication). It refuses fp16: the GradScaler finds inf per rank, not over the ranks.
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn

from . import checkpoint
from .process_group import world_mesh

FSDP = "fsdp"


class ShardedModel(nn.Module):
    """The model after fully_shard, with what the engine uses of DistributedDataParallel: `module`, no_sync()."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Gradients add up unsharded, the parameters gathered, until the last micro-batch reduce-scatters them."""
        self.module.set_requires_gradient_sync(False)
        self.module.set_reshard_after_backward(False)
        try:
            yield
        finally:
            self.module.set_requires_gradient_sync(True)
            self.module.set_reshard_after_backward(True)


def shard(model: nn.Module, recipe, config, device: torch.device) -> ShardedModel:
    """fully_shard: the recipe's shard(model, mesh), else its SHARD classes, else each child with parameters; then the
    root. bf16 reduces gradients in fp32."""
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    mesh = world_mesh(device.type)
    policy = MixedPrecisionPolicy()
    if config.precision == "bf16":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    classes = getattr(recipe, "SHARD", None)
    if callable(getattr(recipe, "shard", None)):
        returned = recipe.shard(model, mesh)
        model = model if returned is None else returned
    elif classes is None:
        for child in [child for child in model.children() if any(True for _ in child.parameters())]:
            fully_shard(child, mesh=mesh, mp_policy=policy)
    else:
        classes = tuple(classes) if isinstance(classes, list) else classes
        found = [module for module in model.modules() if module is not model and isinstance(module, classes)]
        for unit in reversed(found):  # children before parents
            fully_shard(unit, mesh=mesh, mp_policy=policy)
    # The root last, unless shard() wrapped it; it keeps its parameters gathered after forward, as fully_shard does.
    if not isinstance(model, FSDPModule):
        fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    return ShardedModel(model)


def is_sharded(model) -> bool:
    return isinstance(model, ShardedModel)


def full_weights(model) -> dict:
    """The model's state dict whole on rank 0's CPU ({} elsewhere). Every rank calls it: under fsdp it gathers."""
    if not is_sharded(model):
        return checkpoint.on_cpu(model.module.state_dict()) if dist.get_rank() == 0 else {}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model.module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_weights(model, weights: dict) -> None:
    """A whole state dict (under fsdp each rank keeps its shards), or under fsdp this rank's shards (DTensors)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.tensor import DTensor

    if not is_sharded(model):
        model.module.load_state_dict(weights)
        return
    whole = not any(isinstance(value, DTensor) for value in weights.values())
    set_model_state_dict(model.module, weights, options=StateDictOptions(full_state_dict=whole))


def training_state(model, optimizer: torch.optim.Optimizer) -> dict:
    """The model's and optimizer's state: ddp's whole on rank 0, fsdp's this rank's shards keyed by parameter name."""
    if not is_sharded(model):
        return {"model": full_weights(model), "optimizer": optimizer.state_dict()}
    from torch.distributed.checkpoint.state_dict import get_state_dict

    weights, state = get_state_dict(model.module, optimizer)
    return {"model": weights, "optimizer": state}


def load_optimizer_state(model, optimizer: torch.optim.Optimizer, saved: dict) -> None:
    """What training_state() gave, or a ddp checkpoint's whole optimizer state, into this rank's optimizer."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    by_name = any(isinstance(name, str) for group in saved["param_groups"] for name in group["params"])
    if by_name:  # saved by name: fsdp's shards, or any model read from a folder checkpoint
        set_optimizer_state_dict(model.module, optimizer, saved)
        return
    if not is_sharded(model):
        optimizer.load_state_dict(saved)
        return
    names = {id(parameter): name for name, parameter in model.module.named_parameters()}
    ordered = [names[id(parameter)] for group in optimizer.param_groups for parameter in group["params"]]
    keyed = {
        "state": {ordered[number]: value for number, value in saved["state"].items()},
        "param_groups": [{**group, "params": [ordered[n] for n in group["params"]]} for group in saved["param_groups"]],
    }
    set_optimizer_state_dict(model.module, optimizer, keyed, options=StateDictOptions(full_state_dict=True))


def clip_grad_norm(parameters: list, max_norm: float) -> torch.Tensor:
    """clip_grad_norm_'s total norm as a plain tensor: under fsdp it is a DTensor summed over the ranks."""
    norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm)
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


@contextlib.contextmanager
def whole_for_validation(model):
    """fsdp's parameters gathered once for all of validation, where ranks may take one batch more (no collectives)."""
    if not is_sharded(model):
        yield
        return
    from torch.distributed.fsdp import FSDPModule

    root = model.module
    sharded = [module for module in root.modules() if isinstance(module, FSDPModule)]
    root.set_reshard_after_forward(False)
    for module in sharded:
        module.unshard()
    try:
        yield
    finally:
        for module in sharded:
            module.reshard()
        root.set_reshard_after_forward(True)  # the units as they were: resharded after forward; the root not
        root.set_reshard_after_forward(False, recurse=False)
