"""Sharded data parallel (parallelism = "fsdp"): the model wrapped with FSDP2's fully_shard, and its state whole.

Each rank keeps 1/N of every parameter, gradient and optimizer state; a unit's parameters are all-gathered for
its forward and backward, and its gradients reduce-scattered. What a shard unit is, the recipe decides:

- `shard(model, mesh)`, a function of the recipe, calls fully_shard itself (mesh: the ranks' 1-D DeviceMesh);
- else `SHARD = (nn.TransformerEncoderLayer, ...)`: every submodule of those classes is a unit;
- else each direct child module that holds parameters is one.
The root is always a unit last, for the parameters no unit took.

The rest of the engine sees the model through ShardedModel, which answers what it asks of
DistributedDataParallel (`module`, `no_sync()`), and through the functions here that branch on it:
full_weights / load_weights, training_state / load_optimizer_state, clip_grad_norm and whole_for_validation.
A step checkpoint holds each rank's shards (torch.distributed.checkpoint.state_dict's sharded state dicts,
the optimizer's keyed by parameter name), which saving.py writes as a folder; model.pt and best.pt hold the
weights gathered whole to rank 0's CPU (full_state_dict). A ddp checkpoint (a file: whole state dicts, the
optimizer's keyed by parameter number) loads under fsdp too, each rank keeping its shards of it.

Where it runs: the CPU over gloo, and GPUs over nccl. Not GPUs over gloo: ProcessGroupGloo (torch 2.13,
torch/csrc/distributed/c10d/ProcessGroupGloo.cpp) implements reduce_scatter_tensor_coalesced, which FSDP2's
gradient reduce-scatter reaches, as a clone of the input, an allreduce and a copy of the rank's chunk; the
Windows builds of torch have no gloo allreduce of CUDA tensors (pytorch/pytorch#186535, process_group.py's
reduction_device), and the engine keeps every gloo collective on the host, as a rule. Config.problems refuses
it, and fp16 (below). On the CPU the same fact means that gloo's reduce-scatter moves as many bytes as an
all-reduce: fsdp there saves memory, not communication.

fp16 is refused: the GradScaler the engine has unscales whole gradients and finds inf or NaN in them per rank;
sharded gradients need a scaler that agrees over the ranks. bf16 goes through MixedPrecisionPolicy (bf16
parameters in forward and backward, fp32 gradient reduction, fp32 sharded parameters for the optimizer).
"""

from __future__ import annotations

import contextlib

import torch
import torch.distributed as dist
from torch import nn

from . import checkpoint

FSDP = "fsdp"


class ShardedModel(nn.Module):
    """The model after fully_shard, with what the engine uses of DistributedDataParallel: `module` (the model
    itself: fully_shard changes its class, not its names) and no_sync()."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """A micro-batch before the last: gradients add up unsharded on each rank and are reduce-scattered once,
        with the last; the parameters stay gathered until then (no all-gather per micro-batch)."""
        self.module.set_requires_gradient_sync(False)
        self.module.set_reshard_after_backward(False)
        try:
            yield
        finally:
            self.module.set_requires_gradient_sync(True)
            self.module.set_reshard_after_backward(True)


def units(model: nn.Module, recipe) -> list[nn.Module]:
    """The submodules to wrap before the root, innermost first (fully_shard wants children before parents)."""
    classes = getattr(recipe, "SHARD", None)
    if classes is not None:
        classes = tuple(classes) if isinstance(classes, (tuple, list)) else (classes,)
        found = [module for module in model.modules() if module is not model and isinstance(module, classes)]
        return list(reversed(found))  # modules() lists parents first
    return [child for child in model.children() if any(True for _ in child.parameters())]


def shard(model: nn.Module, recipe, config, device: torch.device) -> ShardedModel:
    """fully_shard over all ranks, units as the recipe says (see the module's docstring), mixed precision as
    config.precision says. The model must be on `device` already (recipe.model does that)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    if config.precision == "bf16":
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    else:
        policy = MixedPrecisionPolicy()
    own = getattr(recipe, "shard", None)
    if callable(own):
        returned = own(model, mesh)
        model = returned if returned is not None else model
    else:
        for unit in units(model, recipe):
            fully_shard(unit, mesh=mesh, mp_policy=policy)
    # The root last; it keeps its parameters gathered after forward (fully_shard's own choice for a root),
    # which whole_for_validation restores.
    if not isinstance(model, FSDPModule):  # a shard() hook may have wrapped the root itself
        fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=False)
    return ShardedModel(model)


def is_sharded(model) -> bool:
    return isinstance(model, ShardedModel)


def full_weights(model) -> dict:
    """The model's state dict, whole, on the CPU, on rank 0 (an empty dict elsewhere: only rank 0 writes files).
    Every rank must call it: under fsdp it gathers."""
    if not is_sharded(model):
        if dist.get_rank() != 0:
            return {}
        return checkpoint.on_cpu(model.module.state_dict())
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model.module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def load_weights(model, weights: dict) -> None:
    """A state dict into the model: a whole one (every rank holds it; under fsdp each rank keeps its own shards),
    or under fsdp one of this rank's shards (DTensors, as training_state() gives them)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.tensor import DTensor

    if not is_sharded(model):
        model.module.load_state_dict(weights)
        return
    whole = not any(isinstance(value, DTensor) for value in weights.values())
    set_model_state_dict(model.module, weights, options=StateDictOptions(full_state_dict=whole))


def training_state(model, optimizer: torch.optim.Optimizer) -> dict:
    """{"model": ..., "optimizer": ...} as a step checkpoint holds them. ddp: the model's state dict whole on rank 0's
    CPU ({} elsewhere) and optimizer.state_dict(). fsdp: this rank's shards of both, the optimizer's keyed by
    parameter name (torch.distributed.checkpoint.state_dict), which every rank saves as its own (saving.py)."""
    if not is_sharded(model):
        return {"model": full_weights(model), "optimizer": optimizer.state_dict()}
    from torch.distributed.checkpoint.state_dict import get_state_dict

    weights, state = get_state_dict(model.module, optimizer)
    return {"model": weights, "optimizer": state}


def load_optimizer_state(model, optimizer: torch.optim.Optimizer, saved: dict) -> None:
    """What training_state() gave (or a ddp checkpoint's optimizer state, whole, which every rank holds) into
    this rank's optimizer."""
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
    """clip_grad_norm_, and the total norm as a plain tensor: under fsdp the gradients are DTensors, whose norm
    is a DTensor summed over the ranks; full_tensor() makes it the one number every rank logs."""
    norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm)
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


@contextlib.contextmanager
def whole_for_validation(model):
    """Under fsdp: every unit's parameters gathered once, on every rank, for the whole validation, whose ranks
    may take one batch more or fewer than others (no collective may run per batch). Each rank then holds the
    whole model's parameters (in the forward's dtype) while it validates, but not its gradients or
    optimizer state. Under ddp: nothing."""
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
