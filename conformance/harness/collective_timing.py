"""An all-reduce timed on a group of ranks, every result checked exactly (a world's links, measured).

Shared by the perf family (allreduce-bandwidth's sweep, the scaling cliff) and the node-health
check (each pair of ring neighbours on its own 2-rank group). Each iteration all-reduces a tensor
filled with rank-dependent small integers, ``x[i] = i % 7 + rank + 1`` in float32, whose SUM over
ranks is known exactly (``N * (i % 7) + N(N+1)/2``, exact in float32 for any N a job can have). A
wrong element is a broken collective (bad NIC/GPU memory, a transport bug), not rounding.

Timing: on CPU (gloo) the call is synchronous, so wall time around it is the collective's
time on this rank. On GPU (NCCL) the call only enqueues work: CUDA events recorded on the
current stream bracket it, and the end event is synchronised before it is read.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

WARMUP, ITERS = 3, 10


def _expected(base: Any, world_size: int) -> Any:
    return base * world_size + world_size * (world_size + 1) / 2


def sweep_on(group: Any, rank_in_group: int, group_size: int, device: Any, sizes: Sequence[int], *,
             warmup: int = WARMUP, iters: int = ITERS, corrupt: bool = False) -> dict[str, list[Any]]:
    """Sweep ``sizes`` on ``group`` (every member must call this with the same sizes).

    ``corrupt`` flips one element of this rank's result after each all-reduce: an injected
    silent-corruption fault, so that tests can prove the correctness check can fail.
    """
    import torch
    import torch.distributed as dist

    cuda = device.type == "cuda"
    times: list[list[float]] = []
    wrong: list[int] = []
    for nbytes in sizes:
        n = max(1, nbytes // 4)
        base = (torch.arange(n, device=device) % 7).to(torch.float32)
        mine = base + (rank_in_group + 1)
        expected = _expected(base, group_size)
        buf = torch.empty_like(mine)
        per_iter: list[float] = []
        bad = 0
        for i in range(warmup + iters):
            buf.copy_(mine)  # refill outside the timed region: all_reduce works in place
            if cuda:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize(device)
                start.record()
                dist.all_reduce(buf, group=group)
                end.record()
                end.synchronize()
                elapsed = start.elapsed_time(end) / 1e3
            else:
                t0 = time.perf_counter()
                dist.all_reduce(buf, group=group)
                elapsed = time.perf_counter() - t0
            if corrupt:
                buf[-1] += 1
            if i >= warmup:
                per_iter.append(elapsed)
                # Every timed result is checked, not a sample: corruption can be intermittent.
                bad += int(not torch.equal(buf, expected))
        times.append(per_iter)
        wrong.append(bad)
    return {"times": times, "wrong": wrong}
