"""Persistent world vs a fresh world per check, measured side by side in one run.

    python benchmarks/world_overhead.py                 # 20 checks each way, gloo, 2 ranks
    python benchmarks/world_overhead.py --checks 5      # quicker

Each "check" is the same small DDP check: build a tiny MLP, wrap it in DDP, train 3 steps on
rank-dependent data, and compare the parameters across ranks (they must be identical). The
fresh mode starts and tears down a world for every check, the way PyTorch's own
MultiProcessTestCase does; the persistent mode starts one world and reuses it. Start-up of
the persistent world is reported separately; the last line is
``ratio: <fresh cost per check / persistent cost per check>``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conformance.harness.world import World  # noqa: E402


def small_ddp_check(ctx: Any, seed: int) -> str:
    """3 DDP steps of a tiny MLP; returns a digest of the parameters (equal on every rank)."""
    import hashlib

    import torch
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(seed)
    model = DDP(nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(seed * 100 + ctx.rank)  # each rank its own shard
    for _ in range(3):
        opt.zero_grad()
        x, y = torch.randn(4, 8, generator=gen), torch.randn(4, 1, generator=gen)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    digest = hashlib.sha1()
    for p in model.parameters():
        digest.update(p.detach().numpy().tobytes())
    return digest.hexdigest()


def _judge(results: list[Any]) -> None:
    digests = {r.value for r in results}
    if len(digests) != 1:
        raise SystemExit(f"parameters differ across ranks: {digests}")


def fresh(n: int, world_size: int) -> list[float]:
    costs = []
    for i in range(n):
        start = time.perf_counter()
        with World(world_size, "gloo", deadline=60) as world:
            _judge(world.run(small_ddp_check, i))
        costs.append(time.perf_counter() - start)
    return costs


def persistent(n: int, world_size: int) -> tuple[float, list[float]]:
    start = time.perf_counter()
    world = World(world_size, "gloo", deadline=60).start()
    startup = time.perf_counter() - start
    try:
        _judge(world.run(small_ddp_check, -1))  # warm-up: first DDP construction, lazy imports
        costs = []
        for i in range(n):
            start = time.perf_counter()
            _judge(world.run(small_ddp_check, i))
            costs.append(time.perf_counter() - start)
        return startup, costs
    finally:
        world.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checks", type=int, default=20)
    parser.add_argument("--world-size", type=int, default=2)
    args = parser.parse_args()
    startup, warm = persistent(args.checks, args.world_size)
    cold = fresh(args.checks, args.world_size)
    fresh_cost, warm_cost = statistics.median(cold), statistics.median(warm)
    print(f"checks: {args.checks} each way, gloo, {args.world_size} ranks")
    print(f"persistent world: start-up {startup:.2f} s (once), {warm_cost * 1000:.1f} ms per check "
          f"(median; total {sum(warm):.2f} s)")
    print(f"fresh world per check: {fresh_cost:.2f} s per check (median; total {sum(cold):.2f} s)")
    print(f"ratio: {fresh_cost / warm_cost:.0f}")


if __name__ == "__main__":
    main()
