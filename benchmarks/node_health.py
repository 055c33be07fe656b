"""node-health's figures: detection by bit class and rank, false alarms, and cost in bare steps.

    python benchmarks/node_health.py                       # gloo, 3 ranks on this host
    python benchmarks/node_health.py --clean 100 --cost-width 4096
    python benchmarks/node_health.py --backend nccl --world-size 8   # a GPU node (spawned world)

1. **Detection**: a :class:`BitFlip` of each bit class (lowest mantissa bit, lowest exponent
   bit, sign) in one element of one activation and of one gradient, on each rank, once (repeat
   1 of 3): caught (the check failed), located (rank, tensor, repeat, transient), and whether
   the injector's own record says the flip changed the value at all.
2. **False alarms**: ``--clean`` clean comparisons (repeats of the digest comparison on every
   built-in target's work), counting any disagreement; and a clean full check per target.
3. **Cost**: on an MLP of ``--cost-width`` x 6 layers (4096: 100.7 M parameters) the check's
   wall time against one bare forward/backward of the same work on the same world (the slowest
   rank's): per repeat of the compute comparison (its phase over R = 3, gathers included), the
   whole check (the world call), and each phase.

Every figure is a ratio or a count; the table is printed in one run (docs/node-health.md).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from tabulate import tabulate


def _detection(world: Any, world_size: int) -> list[list[Any]]:
    from ddp_conformance.faults.checks.node_health import judge, judge_injected, measure
    from ddp_conformance.faults.corruption import BIT_CLASSES, BitFlip

    rows = []
    for where in ("output:0", "grad:2.weight"):
        for bit in BIT_CLASSES:
            for rank in range(world_size):
                fault = BitFlip(rank=rank, tensor=where, bit=bit, element=3, steps=(1,))
                results, injections = measure(world, "mlp", repeats=3, fault=fault, buckets=False, speed=False)
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
        results, _ = measure(world, name, repeats=per_target, buckets=False, speed=False)
        compared += per_target
        alarms += sum(1 for rep in results[0]["repeats"] if rep["located"])
        full = judge(measure(world, name)[0])
        statuses.append(f"{name}: {full.status}")
    return compared, alarms, statuses


REPEATS = 3


def _cost(world: Any, width: int) -> dict[str, Any]:
    from ddp_conformance.faults.checks.node_health import judge, measure
    from ddp_conformance.faults.checks.node_health.rank import bare_steps
    from ddp_conformance.faults.vehicles import VehicleSpec

    vehicle = VehicleSpec(kind="mlp", width=width, depth=6)
    world.run(bare_steps, vehicle, steps=2)  # warm-up: first allocations, first kernels
    bare = statistics.median(max(r.value[i] for r in world.run(bare_steps, vehicle, steps=5)) for i in range(5))

    t0 = time.perf_counter()
    results, _ = measure(world, vehicle, repeats=REPEATS)
    judge(results)
    whole = time.perf_counter() - t0
    # The slowest rank's phases: the check waits for it at every gather.
    phases = {k: max(r["phases_s"][k] for r in results) for k in results[0]["phases_s"]}
    return {"parameters": 6 * (width * width + width), "bare_step_s": bare,
            "per_repeat_steps": phases["repeats"] / REPEATS / bare, "whole_check_steps": whole / bare,
            "phases": {k: round(v / bare, 2) for k, v in phases.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    parser.add_argument("--world-size", type=int, default=3)
    parser.add_argument("--clean", type=int, default=50, help="clean comparisons for the false-alarm count")
    parser.add_argument("--cost-width", type=int, default=4096, help="MLP width for the cost (4096: 100 M parameters)")
    args = parser.parse_args()

    from conformance.harness.session import Session, Settings

    session = Session(Settings(backend=args.backend, world_size=args.world_size))
    try:
        world = session.world()
        rows = _detection(world, args.world_size)
        print(tabulate(rows, headers=["tensor", "bit", "rank", "caught", "located right", "value changed",
                                      "message"], tablefmt="github"))
        caught = sum(r[3] for r in rows)
        located = sum(r[4] for r in rows)
        print(f"\ndetection: caught {caught}/{len(rows)}, located right {located}/{len(rows)}")
        compared, alarms, statuses = _false_alarms(world, args.clean)
        print(f"false alarms: {alarms} in {compared} clean comparisons; full check per target: {', '.join(statuses)}")
        cost = _cost(world, args.cost_width)
        print(f"cost on a {cost['parameters'] / 1e6:.1f} M-parameter MLP (bare step {cost['bare_step_s'] * 1e3:.0f} ms): "
              f"{cost['per_repeat_steps']:.2f} bare steps per repeat (bound 2), whole check at R=3 "
              f"{cost['whole_check_steps']:.2f} bare steps (bound 5 + R = 8); the slowest rank's phases in bare steps: "
              f"{cost['phases']}")
    finally:
        session.close()


if __name__ == "__main__":
    main()
