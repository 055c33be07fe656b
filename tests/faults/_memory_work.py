"""World work functions of the rank-memory tests: a call's peak RSS over the rank's RSS before it."""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Callable
from typing import Any


def _kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith(field + ":"))


def peak_of(ctx: Any, fn: Callable[..., Any], *args: Any) -> int:
    """Bytes ``fn(ctx, *args)`` added at its peak to this rank process's RSS (VmHWM reset first)."""
    from conformance.harness.resources import reset_peak

    gc.collect()
    # Freed heap handed back first: a call reusing an earlier call's freed pages would not
    # raise the RSS, and the figure would depend on what ran before.
    ctypes.CDLL(None).malloc_trim(0)
    before = _kib("VmRSS")
    reset_peak()
    fn(ctx, *args)
    return (_kib("VmHWM") - before) * 1024


def training_step(ctx: Any, spec: str, steps: int = 4) -> None:
    """The target's own DDP training step, as the user runs it, at the suite's per-rank batch."""
    from conformance.harness.ddp import PROBE_SEED, build_model, effective_ddp_kwargs, wrap
    from conformance.harness.sharding import rank_batch
    from conformance.harness.targets import load_target

    target = load_target(spec)
    model = wrap(build_model(target, ctx.device, seed=PROBE_SEED), ctx.device, effective_ddp_kwargs(target))
    optimizer = target.make_optimizer(model)
    batch = rank_batch(target, ctx.rank, ctx.world_size, seed=0, device=ctx.device)
    for step in range(steps):
        target.run_step(model, optimizer, [batch], step=step)


def exact_heap(ctx: Any) -> None:
    """Every allocation of 1 MiB or more straight from the kernel and back (a fixed mmap
    threshold, glibc's M_MMAP_THRESHOLD): RSS then shows what a call holds, not the freed heap
    glibc keeps for reuse, which made a 40 MB model's figures depend on what ran before."""
    ctypes.CDLL(None).mallopt(-3, 1 << 20)
