"""A real scaling cliff on one machine: a built-in target's DDP step behind a shaped link,
measured at each rate beside the simulator's prediction (the ``scaling-cliff`` check's sweep).

    sudo python benchmarks/scaling_cliff.py                 # tied-lm, gloo, 2 ranks (needs root)
    sudo python benchmarks/scaling_cliff.py --target mlp --repeats 3

Needs CAP_SYS_ADMIN and CAP_NET_ADMIN (a private network namespace, ``tc tbf`` on its
loopback) and iproute2; without them it prints the reason and exits 0. Printed: the host's
load (``/proc/loadavg``: a shared host makes every timing noisy), how many sweeps were judged
and how well they pin each rate's median error down, then per rate the measured and predicted
step, the compute and the error; then ``cliff_ratio: X`` (the step at the lowest rate over the
unshaped one; want >= 2: a cliff reproduced) and, last, ``max_error: X`` (the simulator's
largest relative error at a shaped rate; want <= 0.15).

The sweep runs several times in one world and the medians per rate are judged: one sweep's
fast rates are the step's scheduling noise on a 2-core host (a single sweep's per-rate error
there is +-20-30 %, centred on zero), which the median of several sweeps averages out; the
slow rates, where the link dominates, are within a few per cent in every sweep. By default it
runs at least 7 sweeps and goes on until every rate's median error has a standard error of at
most 4 % (at most 42 sweeps; on a quiet 2-core host nearly every configuration still had
4.4-6 % after 21). The flat 5 ms step of examples/train_compressed.py with PowerSGD needs
them: over 21 sweeps one of its 7 rates read 17 % (then 14 %) off by chance, its per-sweep
readings spreading 3-9 ms; over 42, every rate was within 8 %. ``--repeats N`` runs exactly N.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from conformance.harness.world import World
from conformance.harness.world import unavailable_reason
from conformance.perf.cliff import model as cm
from conformance.perf.scaling_cliff import SweepData, measure


#: Sweeps the benchmark runs by default: at least MIN_REPEATS, then more until every shaped
#: rate's median error has a standard error of at most MEDIAN_SE, at most MAX_REPEATS.
MIN_REPEATS, MAX_REPEATS, MEDIAN_SE = 7, 42, 0.04


def _loadavg() -> str:
    try:
        return Path("/proc/loadavg").read_text().split(" ", 3)[:3].__str__()
    except OSError:
        return "unknown"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="tied-lm")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=None,
                        help=f"sweeps to run (default: at least {MIN_REPEATS}, then more until every rate's median "
                             f"error is known to +-{MEDIAN_SE * 100:.0f}%%, at most {MAX_REPEATS})")
    parser.add_argument("--save", default=None, help="write every repeat's raw sweep here (JSON lines)")
    args = parser.parse_args()
    reason = unavailable_reason()
    if reason:
        print(f"skipped: {reason}")
        return 0
    print(f"load average (1, 5, 15 min) before: {_loadavg()}")
    runs: list[cm.CliffReport] = []
    with World(args.world_size, "gloo", deadline=300, private_network=True) as world:
        repeat = 0
        while repeat < (args.repeats or MAX_REPEATS):
            if args.repeats is None and len(runs) >= MIN_REPEATS and median_se(runs) <= MEDIAN_SE:
                break
            repeat += 1
            # Every repeat at the first one's rates, so that the medians are per rate.
            data: SweepData = measure(world, args.target, cap_mb=None, rates=runs[0].rates if runs else None)
            if args.save:
                with open(args.save, "a") as f:
                    f.write(json.dumps(dataclasses.asdict(data)) + "\n")
            try:
                points = [cm.link_point(rate, vals, sizes, data.cap_mb)
                          for rate, sizes, vals in zip(data.rates, data.sizes, data.values)]
            except ValueError as exc:  # a rate's all-reduce timings were noise: say so, go on
                print(f"repeat {repeat}: not judged, a rate's timings cannot be fitted ({exc})")
                continue
            runs.append(cm.validate(points))
    print(f"load average after: {_loadavg()}")
    if runs:
        print(f"sweeps judged: {len(runs)}; each rate's median error known to +-{median_se(runs):.1%} "
              f"(its standard error over the sweeps)")
    if not runs:
        print("no repeat could be judged: the host is too loaded to measure")
        return 1
    report = cm.median_report(runs)
    for i, p in enumerate(report.points):
        rate = "unshaped" if p.rate_bits_per_s is None else f"{p.rate_bits_per_s / 1e6:8.2f} Mbit/s"
        mark = " <- knee (measured)" if i == report.measured_index else ""
        mark += " <- knee (predicted)" if i == report.predicted_index else ""
        err = "calibration" if p.rate_bits_per_s is None else f"{p.error:6.1%}"
        print(f"{rate:>16}  measured {p.measured_step_s * 1e3:8.2f} ms  predicted {p.predicted_step_s * 1e3:8.2f} ms"
              f"  compute {p.compute_s * 1e3:7.2f} ms  error {err}{mark}")
    for note in report.notes():
        print(f"note: {note}")
    print(f"knee within one sweep point: {report.knee_agrees}")
    print(f"cliff_ratio: {report.cliff_ratio:.2f}")
    print(f"max_error: {report.max_error:.3f}")
    return 0


def median_se(runs: list[cm.CliffReport]) -> float:
    """The largest standard error, over the shaped rates, of the median of the sweeps' relative
    errors at that rate (1.2533 s / sqrt(n): the median's standard error for normal noise);
    infinite below 3 sweeps. What the sweeps cannot tell apart below this is the host's noise."""
    if len(runs) < 3:
        return float("inf")
    n = len(runs)
    errors = [[r.points[i].predicted_step_s / r.points[i].measured_step_s - 1 for r in runs]
              for i in range(1, len(runs[0].points))]
    return max(1.2533 * statistics.stdev(e) / math.sqrt(n) for e in errors)


if __name__ == "__main__":
    sys.exit(main())
