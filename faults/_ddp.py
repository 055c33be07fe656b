"""Rank-side DDP plumbing shared by the chaos checks: wrapping, data, buckets, run_loop context."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch


def debug_info_on() -> None:
    """Re-read TORCH_DISTRIBUTED_DEBUG before building DDP.

    c10d reads the variable once, when torch.distributed is first imported; a rank that
    imported torch before the world set ``TORCH_DISTRIBUTED_DEBUG=INFO`` would otherwise build
    DDP at level OFF, and DDP's unused-parameter error would give indices instead of names
    (measured on torch 2.13). Never DETAIL: it segfaults DDP construction with gloo.
    """
    import os

    import torch.distributed as dist

    if os.environ.get("TORCH_DISTRIBUTED_DEBUG", "").upper() != "DETAIL":
        dist.set_debug_level_from_env()


def wrap(model: torch.nn.Module, device: Any, ddp_kwargs: dict[str, Any]) -> Any:
    from torch.nn.parallel import DistributedDataParallel as DDP

    debug_info_on()
    model = model.to(device)
    ids = [device.index] if getattr(device, "type", "cpu") == "cuda" else None
    return DDP(model, device_ids=ids, **ddp_kwargs)


def rank_batch(target: Any, seed: int, rank: int, world_size: int, per_rank: int = 4,
               device: Any = None) -> tuple[Any, Any]:
    """This rank's contiguous chunk of a seeded global batch (DESIGN 3.2 splitting)."""
    from conformance.targets import make_batch_checked

    gen = torch.Generator().manual_seed(seed)
    n = per_rank * world_size
    make = getattr(target, "make_batch")
    if hasattr(target, "module"):  # a loaded Target: validate its output at the edge
        inputs, targets = make_batch_checked(target, gen, n)
    else:
        inputs, targets = make(gen, n)
    lo, hi = rank * per_rank, (rank + 1) * per_rank
    inputs, targets = inputs[lo:hi], targets[lo:hi]
    if device is not None:
        inputs, targets = inputs.to(device), targets.to(device)
    return inputs, targets


def bucket_count(ddp_model: Any) -> int:
    """How many buckets DDP reduces per step (rebuilt layout, else the initial one)."""
    data = ddp_model._get_ddp_logging_data()
    for key in ("rebuilt_bucket_sizes", "bucket_sizes"):
        raw = str(data.get(key) or "").strip()
        if raw:
            return len([s for s in raw.split(",") if s.strip()])
    return int(data.get("num_buckets_reduced") or 0)


def ddp_timing(ddp_model: Any) -> dict[str, float]:
    """DDP's own sampled averages (seconds); gloo on CPU fills these in too (torch 2.13)."""
    data = ddp_model._get_ddp_logging_data()
    keys = ("avg_forward_compute_time", "avg_backward_compute_time", "avg_backward_comm_time",
            "avg_backward_compute_comm_overlap_time")
    return {k: float(data.get(k) or 0) / 1e9 for k in keys}


def sync_device(device: Any) -> None:
    if getattr(device, "type", "cpu") == "cuda":
        torch.cuda.synchronize(device)


@dataclass
class LoopContext:
    """What a target's ``run_loop(ctx)`` receives (DESIGN 3.2)."""

    rank: int
    world_size: int
    device: Any
    steps: int
    tmpdir: Path
    ddp_kwargs: dict[str, Any] = field(default_factory=dict)
    on_wrap: Callable[[Any], Any] | None = None  # instrumentation (the collective tracker)
    models: list[Any] = field(default_factory=list)

    def wrap(self, model: torch.nn.Module) -> Any:
        """``model`` wrapped in DDP with the target's ddp_kwargs on this rank's device."""
        ddp = wrap(model, self.device, self.ddp_kwargs)
        if self.on_wrap is not None:
            self.on_wrap(ddp)
        self.models.append(ddp)
        return ddp


