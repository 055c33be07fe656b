"""Overhead of the suite's instrumentation on a DDP step (target: <= 3 %).

    python benchmarks/instrumentation_overhead.py               # wide MLP, 30 rounds
    python benchmarks/instrumentation_overhead.py --rounds 10 --target tests/perf/wide_target.py

In one persistent 2-rank gloo World, rounds alternate a bare DDP step loop and the same loop
with the suite's timers and per-gradient hooks (conformance.perf.measure.profile.GradReadyRecorder,
perf_counter around each step) — alternation in one world, so machine noise hits both sides
alike. Prints each round's ratio and the median ratio instrumented / bare.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conformance.harness.world import RankContext

STEPS = 10


def step_loop(ctx: RankContext, target_spec: str, instrumented: bool, steps: int = STEPS) -> float:
    """Median step time of ``steps`` DDP forward+backward steps on this rank."""
    from conformance.harness.ddp import (
        PROBE_SEED,
        build_model,
        effective_ddp_kwargs,
        wrap,
    )
    from conformance.harness.targets import load_target
    from conformance.perf.measure.profile import GradReadyRecorder, local_batch

    target = load_target(target_spec)
    if "ddp" not in ctx.cache:  # built once: the comparison is of steps, not of construction
        model = build_model(target, ctx.device, seed=PROBE_SEED)
        ctx.cache["ddp"] = wrap(model, ctx.device, effective_ddp_kwargs(target))
        ctx.cache["batch"] = local_batch(target, ctx.rank, ctx.world_size, ctx.device)
    ddp, (inputs, targets) = ctx.cache["ddp"], ctx.cache["batch"]
    recorder = GradReadyRecorder(ddp.module) if instrumented else None
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        if recorder is not None:
            recorder.start()
        ddp.zero_grad(set_to_none=True)
        target.compute_loss(ddp, inputs, targets).backward()
        times.append(time.perf_counter() - t0)
    if recorder is not None:
        recorder.remove()
    return statistics.median(times)


def main() -> None:
    from conformance.harness.world import World

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--target", default="tests/perf/wide_target.py")
    args = parser.parse_args()
    ratios = []
    with World(2, "gloo", deadline=120) as world:
        world.run(step_loop, args.target, False)  # warm-up: DDP construction, bucket rebuild
        for i in range(args.rounds):
            # ABBA order: a drift in machine load during a round hits both sides equally.
            order = (False, True) if i % 2 == 0 else (True, False)
            times = {inst: max(r.value for r in world.run(step_loop, args.target, inst)) for inst in order}
            bare, inst = times[False], times[True]
            ratios.append(inst / bare)
            print(f"round {i + 1}: bare {bare * 1e3:.2f} ms, instrumented {inst * 1e3:.2f} ms, ratio {inst / bare:.3f}")
    median = statistics.median(ratios)
    # A distribution-free 90 % interval for the median ratio, from the order statistics.
    ordered = sorted(ratios)
    k = max(int(len(ordered) / 2 - 0.82 * len(ordered) ** 0.5), 0)
    low, high = ordered[k], ordered[-k - 1]
    print(f"rounds: {len(ratios)}; median ratio instrumented/bare {median:.3f}, "
          f"90 % interval [{low:.3f}, {high:.3f}]")
    print(f"instrumentation overhead: {(median - 1) * 100:+.1f} % (target <= +3 %)")
    print(f"ratio: {median / 1.03:.3f} (median instrumented/bare over the allowed 1.03; want <= 1)")


if __name__ == "__main__":
    main()
