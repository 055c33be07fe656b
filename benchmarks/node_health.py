"""node-health's figures: detection by bit class and rank, false alarms, and cost in bare steps.

    python benchmarks/node_health.py                       # gloo, 3 ranks on this host
    python benchmarks/node_health.py --clean 100 --cost-width 4096
    python benchmarks/node_health.py --only cost --cost-width 2048 --cost-runs 3   # the cost alone
    python benchmarks/node_health.py --backend nccl --world-size 8   # a GPU node (spawned world)

1. **Detection**: a :class:`BitFlip` of each bit class (lowest mantissa bit, lowest exponent
   bit, sign) in one element of one activation and of one gradient, and a
   :class:`CorruptAllReduce` of each in one element of the first bucket, on each rank, once
   (repeat 1 of 3): caught (the check failed), located (rank, tensor or bucket, repeat,
   transient), and whether the injector's own record says the flip changed the value at all.
2. **False alarms**: ``--clean`` clean comparisons (repeats of the digest comparison, compute and
   all-reduced buckets, on every built-in target's work), counting any disagreement; and a
   clean full check per target.
3. **Cost**: on an MLP of ``--cost-width`` x 6 layers (4096: 100.7 M parameters) the check's
   wall time in the user's DDP training steps of the same work on the same world (forward,
   backward, all-reduce, optimizer step: the yardstick of benchmarks/model_scale.py; the slowest
   rank's, measured before and after the check), and in plain forward/backwards beside it: per
   repeat of the compute comparison (its phase over R = 3, gathers included), the whole check
   (the world call), and each phase, with the host's load average before and after.

Every figure is a ratio or a count; the table is printed in one run (docs/node-health.md).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from tabulate import tabulate


def _detection(world: Any, world_size: int) -> list[list[Any]]:
    from ddp_conformance.faults.checks.node_health import judge, judge_injected, measure
    from ddp_conformance.faults.corruption import BIT_CLASSES, BitFlip, CorruptAllReduce

    rows = []
    for where in ("output:0", "grad:2.weight", "bucket:0"):
        for bit in BIT_CLASSES:
            for rank in range(world_size):
                fault: Any = (CorruptAllReduce(rank=rank, bucket=0, bit=bit, element=3, steps=(1,))
                              if where.startswith("bucket") else
                              BitFlip(rank=rank, tensor=where, bit=bit, element=3, steps=(1,)))
                # The check's own path: through DDP, the buckets compared in every repeat.
                results, injections = measure(world, "mlp", repeats=3, fault=fault, speed=False)
                outcome = judge(results)
                right = judge_injected(fault, outcome, injections, world_size=world_size, repeats=3)
                changed = all(i.data.get("value_changed") for i in injections)
                rows.append([where, bit, rank, outcome.status == "failed", right.status == "passed", changed,
                             outcome.message[:90]])
    return rows


def _false_alarms(world: Any, clean: int) -> tuple[int, int, list[str]]:
    from conformance.harness.targets import BUILTINS
    from ddp_conformance.faults.checks.node_health import judge, measure

    per_target = max(1, clean // len(BUILTINS))
    compared = alarms = 0
    statuses = []
    for name in BUILTINS:
        # The check's own path (through DDP): compute and all-reduced buckets, every repeat.
        results, _ = measure(world, name, repeats=per_target, speed=False)
        compared += per_target
        alarms += sum(1 for rep in results[0]["repeats"] if rep["located"] or rep["buckets"])
        full = judge(measure(world, name)[0])
        statuses.append(f"{name}: {full.status}")
    return compared, alarms, statuses


REPEATS = 3


def _slowest(world: Any, fn: Any, vehicle: Any, steps: int) -> list[float]:
    """Per step, the slowest rank's seconds (the ranks start each step together)."""
    values = [r.value for r in world.run(fn, vehicle, steps=steps)]
    return [max(v[i] for v in values) for i in range(steps)]


def _cost(world: Any, width: int) -> dict[str, Any]:
    from ddp_conformance.faults.checks.node_health import judge, measure
    from ddp_conformance.faults.checks.node_health.rank import bare_steps, training_steps
    from ddp_conformance.faults.vehicles import VehicleSpec

    vehicle = VehicleSpec(kind="mlp", width=width, depth=6)
    world.run(training_steps, vehicle, steps=2)  # warm-up: first allocations, first kernels
    # The yardsticks, before and after the check (the host's load moves): the user's DDP training
    # step (forward, backward, all-reduce, optimizer step: what the bound counts in, as
    # benchmarks/model_scale.py does) and the plain forward/backward of the same work.
    train = _slowest(world, training_steps, vehicle, 3)
    plain = _slowest(world, bare_steps, vehicle, 3)
    load = [os.getloadavg()[0]]
    t0 = time.perf_counter()
    results, _ = measure(world, vehicle, repeats=REPEATS)
    outcome = judge(results)
    whole = time.perf_counter() - t0
    load.append(os.getloadavg()[0])
    train += _slowest(world, training_steps, vehicle, 3)
    plain += _slowest(world, bare_steps, vehicle, 3)
    step, bare = statistics.median(train), statistics.median(plain)
    # The slowest rank's phases: the check waits for it at every gather.
    phases = {k: max(r["phases_s"][k] for r in results) for k in results[0]["phases_s"]}
    return {"parameters": 6 * (width * width + width), "training_step_s": step, "bare_step_s": bare,
            "status": outcome.status, "load": load,
            "per_repeat_steps": phases["repeats"] / REPEATS / step, "whole_check_steps": whole / step,
            "per_repeat_bare": phases["repeats"] / REPEATS / bare, "whole_check_bare": whole / bare,
            "phases": {k: round(v / step, 2) for k, v in phases.items()}}


def _print_cost(cost: dict[str, Any]) -> None:
    print(f"cost on a {cost['parameters'] / 1e6:.1f} M-parameter MLP, load {cost['load'][0]:.1f} -> "
          f"{cost['load'][1]:.1f} on {os.cpu_count()} cores (check {cost['status']}): DDP training step "
          f"{cost['training_step_s'] * 1e3:.0f} ms, plain forward/backward {cost['bare_step_s'] * 1e3:.0f} ms; "
          f"per repeat {cost['per_repeat_steps']:.2f} training steps (bound 2; {cost['per_repeat_bare']:.2f} plain "
          f"forward/backwards), whole check at R={REPEATS} {cost['whole_check_steps']:.2f} training steps "
          f"(bound 5 + R = {5 + REPEATS}; {cost['whole_check_bare']:.2f} plain); the slowest rank's phases in "
          f"training steps: {cost['phases']}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    parser.add_argument("--world-size", type=int, default=3)
    parser.add_argument("--clean", type=int, default=50, help="clean comparisons for the false-alarm count")
    parser.add_argument("--cost-width", type=int, default=4096, help="MLP width for the cost (4096: 100 M parameters)")
    parser.add_argument("--cost-runs", type=int, default=1, help="cost measurements, one line each")
    parser.add_argument("--only", choices=("detection", "false-alarms", "cost"), help="one part alone")
    parser.add_argument("--deadline", type=float, default=600.0,
                        help="seconds one world call may take (the 100 M cost's check, on a busy host: minutes)")
    args = parser.parse_args()

    from conformance.harness.session import Session, Settings

    session = Session(Settings(backend=args.backend, world_size=args.world_size, deadline=args.deadline))
    try:
        world = session.world()
        if args.only in (None, "detection"):
            rows = _detection(world, args.world_size)
            print(tabulate(rows, headers=["tensor", "bit", "rank", "caught", "located right", "value changed",
                                          "message"], tablefmt="github"))
            caught = sum(r[3] for r in rows)
            located = sum(r[4] for r in rows)
            print(f"\ndetection: caught {caught}/{len(rows)}, located right {located}/{len(rows)}")
        if args.only in (None, "false-alarms"):
            compared, alarms, statuses = _false_alarms(world, args.clean)
            print(f"false alarms: {alarms} in {compared} clean comparisons; full check per target: "
                  f"{', '.join(statuses)}")
        if args.only in (None, "cost"):
            for _ in range(args.cost_runs):
                _print_cost(_cost(world, args.cost_width))
    finally:
        session.close()


if __name__ == "__main__":
    main()
