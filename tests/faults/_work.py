"""Work functions the fault tests send to ranks (module-level: pickled by reference)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conformance.harness.world import RankContext


def nccl_flight_summary(ctx: RankContext) -> dict[str, Any] | None:
    """One NCCL all-reduce, synchronised, then this rank's flight-recorder summary of it."""
    import torch
    import torch.distributed as dist

    from ddp_conformance.faults import _flight

    since = time.time_ns()
    t = torch.ones(8, device=ctx.device)
    dist.all_reduce(t)
    torch.cuda.synchronize(ctx.device)
    # NCCL's watchdog thread marks the work completed in the recorder some time after the
    # kernel ended: give it a few polls before reading "last completed".
    until = time.monotonic() + 5.0
    while True:
        summary = _flight.summarize(_flight.dump("nccl"), since_ns=since)
        if _flight.pending(summary) is None or time.monotonic() > until:
            return summary
        time.sleep(0.1)


def spin_delay_cost(ctx: RankContext, slow_rank: int, seconds: float) -> dict[str, float]:
    """``slow_rank`` delays by a device-side spin before an all-reduce; every rank reports how
    long its host spent in ``delay`` and how long the all-reduce took to complete."""
    import torch
    import torch.distributed as dist

    from ddp_conformance.faults.injectors import delay

    t = torch.ones(1024, device=ctx.device)
    dist.all_reduce(t)  # warm-up: NCCL's communicator is created lazily on the first call
    torch.cuda.synchronize(ctx.device)
    dist.barrier()
    start = time.perf_counter()
    if ctx.rank == slow_rank:
        delay(seconds, ctx.device)
    host = time.perf_counter() - start
    dist.all_reduce(t)
    torch.cuda.synchronize(ctx.device)
    return {"host_s": host, "total_s": time.perf_counter() - start}
