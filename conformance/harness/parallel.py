"""A target's own wrapper: ``parallelize(model, ctx)`` instead of DDP, and what it applied.

PyTorch is folding DDP into FSDP2: production code wraps with ``fully_shard`` (per block and the
root) or the composable ``replicate`` instead of ``DistributedDataParallel``. A target that
defines ``parallelize(model, ctx) -> nn.Module`` (docs/targets.md, "The names") is wrapped by
it wherever the suite would wrap in DDP (``ddp.wrap``: every check, and ``ctx.wrap`` in
``run_loop``); :func:`wrapper_of` names what the returned module is, for the report.

    ctx = ParallelContext.for_world(device, rank, world_size)   # mesh over the whole world
    trained = parallelize(target, model, ctx)                    # the target's, checked

FSDP2 leaves parameters and gradients as ``DTensor`` shards: :func:`full` gathers one to the
full tensor a single process would hold (a collective: every rank calls it, in the same order).
Functions here run inside rank processes; torch is imported lazily.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

#: What trained the model (``wrapper_of``): the report's ``wrapper`` field.
DDP, REPLICATE, REPLICATE_WITH_FSDP, FULLY_SHARD, NONE = (
    "DDP", "replicate", "replicate_with_fsdp", "fully_shard", "none")
WRAPPERS = (DDP, REPLICATE, REPLICATE_WITH_FSDP, FULLY_SHARD, NONE)
#: The wrappers built on FSDP2: parameters and gradients are DTensors, accumulation is
#: ``set_requires_gradient_sync(False)``, reductions go through ``torch.distributed``'s
#: Python functions (reduce-scatter, all-reduce), and no DDP bucket or comm hook exists.
FSDP2_WRAPPERS = (REPLICATE_WITH_FSDP, FULLY_SHARD)


def not_applicable(what: str) -> str:
    """The skip reason of a DDP-only check on a target with ``parallelize`` (never blocks ready)."""
    return (f"not applicable to FSDP2: the target trains through parallelize (fully_shard / "
            f"replicate), not DistributedDataParallel, so {what} is not what production runs")


#: FSDP2's parameter all-gathers as ``torch.distributed.<name>`` (``all_gather_into_tensor``: the
#: name torch before 2.13 called); its reductions are ``observe.comm_rounds.FSDP2_REDUCTIONS``.
FSDP2_ALL_GATHERS = ("all_gather_single", "all_gather_into_tensor")
#: What a message calls each collective FSDP2 issues (DDP's bucket all-reduces are ``all_reduce``
#: too, told apart by the wrapper).
COLLECTIVE_WORDS = {"all_gather_single": "all-gathers", "all_gather_into_tensor": "all-gathers",
                    "reduce_scatter_single": "reduce-scatters", "reduce_scatter_tensor": "reduce-scatters",
                    "all_reduce": "all-reduces"}

#: Errors by which gloo refuses what FSDP2 asks of it, and the backend-neutral name of what was
#: refused. FSDP2 reduce-scatters with ``ReduceOp.PREMUL_SUM(1/factor)`` when a gradient divide
#: factor other than the world size is set (``set_gradient_divide_factor``: torchtitan's 1.0 for
#: a loss already divided by the global token count), and gloo implements no PREMUL_SUM: the
#: step cannot run on gloo at all, which says nothing about the target's training code.
GLOO_REFUSALS = {"Cannot use ReduceOp.PREMUL_SUM with Gloo": "PREMUL_SUM reduce-scatter is not available on gloo"}


def gloo_refusal(errors: Iterable[str]) -> str | None:
    """``"needs nccl: <what gloo lacks>"`` when a rank's error is gloo refusing an operation
    FSDP2 issued (:data:`GLOO_REFUSALS`), else None: the check is inconclusive on gloo, never a
    failure blamed on the target, never a pass."""
    for error in errors:
        for refusal, lacking in GLOO_REFUSALS.items():
            if refusal in error:
                return f"needs nccl: {lacking}"
    return None


@dataclass(frozen=True, slots=True)
class ParallelContext:
    """What ``parallelize(model, ctx)`` receives (docs/targets.md, "The parallelize context")."""

    #: A 1-D ``DeviceMesh`` over every rank of the world, on the world's device type.
    mesh: Any
    device: Any
    rank: int
    world_size: int

    @classmethod
    def for_world(cls, device: Any, rank: int, world_size: int) -> ParallelContext:
        return cls(world_mesh(getattr(device, "type", "cpu"), world_size), device, rank, world_size)


# One mesh per (device type, world size, default group) in a rank process: a persistent world
# parallelizes many models, and the mesh's construction is collective bookkeeping it needs once.
_MESHES: dict[tuple[str, int, int], Any] = {}


def world_mesh(device_type: str, world_size: int) -> Any:
    """The 1-D mesh over the whole world (its group is the default process group)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    key = (device_type, world_size, id(dist.group.WORLD))
    if key not in _MESHES:
        _MESHES[key] = init_device_mesh(device_type, (world_size,))
    return _MESHES[key]


def parallelize(target: Any, model: Any, device: Any, rank: int, world_size: int) -> Any:
    """``target.parallelize(model, ctx)`` on this rank: the module it returned, checked.

    FSDP2's ``fully_shard`` does not broadcast: every rank shards the weights it built itself,
    so every rank must build the same weights (the suite seeds every build alike). An
    exception of the user's own code is a TargetError; a return that is not a module is one
    too (one line, ``file:line`` of the function).
    """
    import torch

    from .target_calls import defined_at
    from .targets.errors import SEE, TargetError, call_target

    fn = target.parallelize
    ctx = ParallelContext.for_world(device, rank, world_size)
    returned = call_target(target, "parallelize", fn, model.to(device), ctx)
    if not isinstance(returned, torch.nn.Module):
        raise TargetError(f"target {target.name!r}: parallelize (defined at {defined_at(fn)}) returned "
                          f"a {type(returned).__name__}, not the nn.Module to train; return the "
                          f"model after fully_shard/replicate, e.g. `fully_shard(model, "
                          f"mesh=ctx.mesh); return model` ({SEE})")
    return returned


def wrapper_of(trained: Any) -> str:
    """Which wrapper trained the model: one of :data:`WRAPPERS`, read off the module itself
    (through a ``torch.compile`` around it)."""
    from torch.distributed._composable.contract import _get_registry
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    module = getattr(trained, "_orig_mod", trained)
    if isinstance(module, DistributedDataParallel):
        return DDP
    try:
        from torch.distributed._composable.replicate_with_fsdp import ReplicateModule
    except ImportError:  # torch without the FSDP2-based replicate
        ReplicateModule = ()  # type: ignore[assignment,misc]  # noqa: N806
    if isinstance(module, ReplicateModule):
        return REPLICATE_WITH_FSDP
    if isinstance(module, FSDPModule):
        return FULLY_SHARD
    registry = _get_registry(module) or {}
    if "replicate" in registry:
        return REPLICATE
    return FULLY_SHARD if "fully_shard" in registry else NONE


def is_fsdp2(trained: Any) -> bool:
    """True when FSDP2 (``fully_shard`` or the FSDP2-based ``replicate``) wraps the model."""
    return wrapper_of(trained) in FSDP2_WRAPPERS


def full(tensor: Any) -> Any:
    """The whole tensor a single process would hold: a DTensor gathered (``full_tensor()``, an
    all-gather: every rank of the mesh must call it, in the same order), anything else as is."""
    gather = getattr(tensor, "full_tensor", None)
    return tensor if tensor is None or gather is None else gather()


def full_named(named: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    """``(name, full(tensor))`` for each pair, in order (a collective per DTensor)."""
    for name, tensor in named:
        yield name, full(tensor)


def comparable(tensor: Any) -> Any:
    """What is compared across ranks: a replicated DTensor's local tensor (bitwise equal on
    every rank when training is right), a sharded one gathered to the full tensor (an
    all-gather: every rank calls it, in the same order), anything else as is."""
    placements = getattr(tensor, "placements", None)
    if placements is None:
        return tensor
    if all(p.is_replicate() for p in placements):
        return tensor.to_local()
    return tensor.full_tensor()


def local(tensor: Any) -> Any:
    """This rank's shard of a DTensor (``to_local()``), anything else as is."""
    to_local = getattr(tensor, "to_local", None)
    return tensor if tensor is None or to_local is None else to_local()
