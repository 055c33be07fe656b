"""How accurately the straggler check names a slow rank and measures its cost.

    python benchmarks/straggler_accuracy.py                 # gloo, 2 ranks on this host
    python benchmarks/straggler_accuracy.py --backend nccl --world-size 8 --steps 10
    # under a launcher the suite owns the ranks: torchrun is not needed (spawned world)

Measures an unfaulted baseline step, then injects a forward delay on the last rank of 10 %,
50 % and 200 % of that step, side by side in one world (one run, same processes). For each
it prints the top-scored rank (and the one the check names: score above the threshold),
the measured cost vs the injected delay, and the
measured step inflation vs the expected one ((step + delay) / step), as ratios.
"""

from __future__ import annotations

import argparse

from tabulate import tabulate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8, help="timed steps per delay (median)")
    args = parser.parse_args()

    from conformance.harness.session import Session, Settings
    from ddp_conformance.faults.checks.straggler import VEHICLE, measure
    from ddp_conformance.faults.injectors import SlowRank

    session = Session(Settings(backend=args.backend, world_size=args.world_size))
    try:
        world = session.world()
        victim = args.world_size - 1
        base = measure(world, VEHICLE, [None], steps_each=args.steps)[0]["verdict"].step_s
        fractions = (0.1, 0.5, 2.0)
        # Unfaulted segments before and after the delays: the baseline is their mean, so a
        # drift of the host during the run shows up in neither direction alone.
        faults = [None] + [SlowRank(rank=victim, phase="forward", delay_s=f * base) for f in fractions] + [None]
        segments = measure(world, VEHICLE, faults, steps_each=args.steps)
        base_now = (segments[0]["verdict"].step_s + segments[-1]["verdict"].step_s) / 2
        rows = []
        for frac, seg in zip(fractions, segments[1:-1]):
            v, delay_s = seg["verdict"], seg["fault"].delay_s
            top = max(v.per_rank, key=lambda d: d["score"])
            rows.append([f"{frac:.0%}", f"{delay_s * 1e3:.2f}", victim, top["rank"], f"{top['score']:.2f}",
                         v.culprit_rank, "yes" if top["rank"] == victim else "NO",
                         f"{v.cost_s * 1e3:.2f}", f"{v.cost_s / delay_s:.2f}",
                         f"{v.step_s / base_now:.2f}", f"{(base_now + delay_s) / base_now:.2f}"])
        print(f"baseline step {base_now * 1e3:.2f} ms ({args.backend}, {args.world_size} ranks, "
              f"median of {args.steps} steps per row)")
        print(tabulate(rows, headers=["delay/step", "delay ms", "injected rank", "top rank", "score",
                                      "named (score>0.25)", "correct",
                                      "cost ms", "cost/delay", "inflation", "expected inflation"]))
    finally:
        session.close()


if __name__ == "__main__":
    main()
