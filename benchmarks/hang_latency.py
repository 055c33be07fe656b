"""Hang detection latency versus the configured deadline.

    python benchmarks/hang_latency.py                  # deadlines 1, 2, 4 s
    python benchmarks/hang_latency.py --deadlines 0.5 1 2 4 8

For each deadline D: a fresh 2-rank gloo World, rank 1 sleeps forever while rank 0 waits for
it in an all-reduce; the time until the supervisor raises WorldHang (stacks collected, world
killed) is printed next to D. The ratio latency / D should sit just above 1.0: the rest is
stack collection and the kill, a fixed cost that matters less as D grows.
"""

from __future__ import annotations

import argparse
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conformance.harness.world import RankContext


def sleep_forever_on_rank1(ctx: RankContext) -> None:
    import torch
    import torch.distributed as dist

    if ctx.rank == 1:
        while True:
            time.sleep(0.05)
    dist.all_reduce(torch.ones(1))  # rank 0 blocks here, waiting for rank 1


def main() -> None:
    from conformance.harness.world import World, WorldHang

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--deadlines", type=float, nargs="+", default=[1.0, 2.0, 4.0])
    args = parser.parse_args()
    print(f"{'deadline (s)':>12} {'detected (s)':>12} {'latency/D':>10} {'stuck':>8}")
    for deadline in args.deadlines:
        # pg timeout well past D: the supervisor's deadline, not gloo's timeout, must fire first.
        world = World(2, "gloo", deadline=deadline, pg_timeout=deadline * 10 + 5).start()
        start = time.perf_counter()
        try:
            world.run(sleep_forever_on_rank1)
            print(f"{deadline:12.2f} {'no hang?':>12}")
        except WorldHang as hang:
            latency = time.perf_counter() - start
            print(f"{deadline:12.2f} {latency:12.3f} {latency / deadline:10.3f} {str(hang.stuck_ranks):>8}")
        finally:
            world.close()


if __name__ == "__main__":
    main()
