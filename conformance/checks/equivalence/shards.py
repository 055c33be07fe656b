"""FSDP2's shards in the recorded run: each rank's own shard of a gradient, judged on its own.

The equivalence checks compare the *full* gradients (every shard gathered, ``full_tensor()``)
against the single-process step; a difference there says that the gradients differ, not that
each rank did something to its own shard. One port bug does exactly that: clipping computed
from the rank's local shard norm (``p.grad.to_local()``) instead of the global norm scales every
rank's shard by its own factor. :func:`shard_factor` measures, on one rank, the least-squares
factor between its local shards and the same slices of the reference's gradients (and how well
one factor explains them); ``hypotheses.shard_cause`` names the cause when every rank's shard is
uniformly scaled by its own factor, the factors differ, and none scales up.

Runs inside rank processes; torch is imported lazily.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .records import ShardFactor


def local_slices(named: Iterable[tuple[str, Any]]) -> dict[str, tuple[Any, tuple[slice, ...]]]:
    """For each sharded (DTensor) gradient: this rank's shard and where it sits in the full
    tensor. Empty when nothing is sharded (DDP, the DDP-based replicate)."""
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    found = {}
    for name, tensor in named:
        if tensor is None or not hasattr(tensor, "device_mesh"):
            continue
        shape, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh,
                                                              tensor.placements)
        found[name] = (tensor.to_local(), tuple(slice(o, o + s) for o, s in zip(offset, shape)))
    return found


def shard_factor(slices: dict[str, tuple[Any, tuple[slice, ...]]], folder: Path, label: str,
                 device: Any) -> ShardFactor | None:
    """This rank's shards against the reference's snapshot ``label`` (``snapshots``), one
    factor for all of them; None with no shard or no reference energy to project on."""
    import torch

    from .snapshots import read_snapshot

    dot = ref_sq = got_sq = 0.0
    pairs = []
    for name, ref in read_snapshot(folder, label, device):
        if ref is None or name not in slices:
            continue
        got, where = slices[name]
        part = ref[where].to(torch.float64)
        mine = got.detach().to(torch.float64)
        if tuple(part.shape) != tuple(mine.shape):
            continue
        dot += float((mine * part).sum())
        ref_sq += float((part * part).sum())
        got_sq += float((mine * mine).sum())
        pairs.append((mine, part))
    if not pairs or not ref_sq > 0 or not got_sq > 0:
        return None
    factor = dot / ref_sq
    rest = sum(float(((mine - factor * part) ** 2).sum()) for mine, part in pairs)
    return ShardFactor(factor=factor, residual=math.sqrt(rest / got_sq), tensors=len(pairs))
