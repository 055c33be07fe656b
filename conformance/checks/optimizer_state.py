"""rank-consistency on FSDP2: the optimizer's state held as its parameters are, and alike on every rank.

Under ``fully_shard`` each rank's optimizer steps only its shard of every parameter: its state
(momentum, Adam's moments) must be a shard of the same layout — a DTensor with the parameter's
placements and local shape — and the parts every rank holds whole (Adam's ``step``, a state
tensor of a replicated parameter under ``replicate_with_fsdp``) must be bit-identical across
ranks. Two ports break that silently while the parameters still compare equal (their gathered
full tensors are the same on every rank by construction):

- one rank skips ``optimizer.step()`` (a loss-spike guard on the rank's *local* loss): that
  rank's shards stop training while the others' go on; its state has fewer steps, or none;
- an optimizer built before ``fully_shard`` (on the unsharded parameters, which ``fully_shard``
  replaces with DTensors): it steps tensors the model no longer holds, and the model never
  trains.

What runs (rank side, no collective: each rank reads its own state): :func:`named_state` names
every state entry ``<parameter>:<key>`` with a digest a rank can compare — the bits of a tensor
every rank holds whole, the layout (placements, global shape, dtype) of a sharded one, whose
values differ per rank by design (gathered, they are the same tensor on every rank: comparing
them across ranks would be vacuous); :func:`layout_problems` names each state entry whose
layout is not its parameter's, and each parameter the optimizer steps that is not the model's.
The supervisor compares the digests across ranks as every other rank-consistency checkpoint.
"""

from __future__ import annotations

import hashlib
from typing import Any

#: The checkpoint kind in rank-consistency's record.
KIND = "optimizer state"
#: Said after "rank r has none" where a state entry exists on some ranks only.
ABSENT = ": that rank's optimizer did not step this parameter"
RECOMMENDATION = ("every rank must call optimizer.step() at every step, with the same decision: a "
                  "guard that skips a step (a loss spike, a non-finite gradient) must decide on a value "
                  "reduced over all ranks (all_reduce the loss or the norm first), never on the rank's own")
LAYOUT_RECOMMENDATION = ("build the optimizer after parallelize, on the parameters of the module it returned "
                         "(fully_shard replaces every parameter with a DTensor), and load optimizer state "
                         "through torch.distributed.checkpoint.state_dict.set_optimizer_state_dict, which "
                         "shards it as the parameters are")


def _named_params(model: Any) -> dict[int, str]:
    return {id(p): name for name, p in model.named_parameters()}


def _digest(value: Any) -> tuple[str, float]:
    """What a rank compares of one state entry: (digest, a float sum for the size of a
    difference and NaN/Inf). A sharded DTensor is digested by its layout, and summed over the
    local shard (NaN there is NaN); every other tensor by its bits."""
    import torch

    from ..harness.ddp import tensor_digest

    placements = getattr(value, "placements", None)
    if placements is not None and not all(p.is_replicate() for p in placements):
        local = value.to_local()
        layout = f"{tuple(placements)}{tuple(value.shape)}{value.dtype}"
        return (hashlib.sha1(layout.encode()).hexdigest()[:16],
                float(local.sum(dtype=torch.float64)) if local.is_floating_point() else float(local.sum()))
    if placements is not None:
        value = value.to_local()
    if isinstance(value, torch.Tensor):
        total = float(value.sum(dtype=torch.float64)) if value.is_floating_point() else float(value.sum())
        return tensor_digest(value), total
    return hashlib.sha1(repr(value).encode()).hexdigest()[:16], float("nan") if value != value else 0.0


def named_state(model: Any, optimizer: Any) -> dict[str, tuple[str, float]]:
    """Every entry of the optimizer's state, ``"<parameter name>:<key>"`` -> :func:`_digest`, in
    the model's registration order; a parameter the model does not hold is named by position."""
    state = getattr(optimizer, "state", None) or {}
    names = _named_params(model)
    order = {pid: i for i, pid in enumerate(names)}
    stepped = [p for group in getattr(optimizer, "param_groups", None) or [] for p in group["params"]]
    stepped.sort(key=lambda p: order.get(id(p), len(order)))
    out: dict[str, tuple[str, float]] = {}
    for i, param in enumerate(stepped):
        entries = state.get(param) or {}
        name = names.get(id(param), f"param_groups[*][{i}]")
        for key, value in entries.items():
            out[f"{name}:{key}"] = _digest(value)
    return out


def layout_problems(models: list[Any], optimizer: Any) -> list[str]:
    """Each parameter the optimizer steps that is none of ``models``' (the models trained), and
    each state entry shaped like its parameter but not laid out as it is (placements, local
    shape), in words."""
    names = {pid: name for model in models for pid, name in _named_params(model).items()}
    state = getattr(optimizer, "state", None) or {}
    problems: list[str] = []
    stepped = [p for group in getattr(optimizer, "param_groups", None) or [] for p in group["params"]]
    # The measured cause only: a plain tensor of a sharded parameter's full shape, the copy
    # fully_shard replaced (a loss module's own parameter, stepped beside the model's, is not).
    sharded = {tuple(p.shape) for model in models for p in model.parameters() if hasattr(p, "placements")}
    foreign = [p for p in stepped
               if id(p) not in names and not hasattr(p, "placements") and tuple(p.shape) in sharded]
    if foreign:
        problems.append(
            f"the optimizer steps {len(foreign)} of its {len(stepped)} tensor(s) that are not parameters of "
            f"the trained model but plain tensors of its sharded parameters' shapes (e.g. "
            f"{tuple(foreign[0].shape)}): it was built on the "
            f"parameters before fully_shard/replicate replaced them with DTensors, so optimizer.step() "
            f"never updates the model")
    for param in stepped:
        if id(param) not in names:
            continue
        for key, value in (state.get(param) or {}).items():
            if getattr(value, "shape", None) != param.shape or not hasattr(value, "shape"):
                continue  # a scalar (Adam's step) or a state of another shape: nothing to align
            ours, theirs = getattr(param, "placements", None), getattr(value, "placements", None)
            local = getattr(value, "to_local", lambda: value)().shape
            mine = getattr(param, "to_local", lambda: param)().shape
            if ours != theirs or local != mine:
                problems.append(f"{names[id(param)]}:{key} is laid out as {theirs or 'a plain tensor'} "
                                f"{tuple(local)} on this rank, its parameter as {ours or 'a plain tensor'} "
                                f"{tuple(mine)}")
    return problems
