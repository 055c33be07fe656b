"""Wall time of the CI subset against its 2-minute budget (`--suite ci` < 120 s on 2 cores; README, "Development").

    python benchmarks/ci_wall_time.py                 # one run, gloo, 2 ranks
    python benchmarks/ci_wall_time.py --repeat 3      # median of 3
    python benchmarks/ci_wall_time.py --repeat 3 --against ../base/.venv/bin/python
                                                      # side by side with another checkout

Prints each run's wall time and the ratio to the budget (< 1.0 is within budget). Absolute
times vary between machines; the ratio on a 2-core machine is the number CI cares about.

``--against PYTHON`` runs the same subset with another interpreter (the virtualenv of another
checkout, e.g. the main before a change), alternating the two run by run so that a host's
load drifts over both alike, and prints ``ratio_vs_against``: this tree's median over the
other's. That ratio, not two absolute times taken minutes apart, is what a change is judged by.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time

BUDGET_S = 120.0


def one_run(python: str = sys.executable) -> tuple[float, int]:
    with tempfile.TemporaryDirectory(prefix="ci-wall-") as out:
        start = time.perf_counter()
        proc = subprocess.run([python, "-m", "conformance", "run", "--suite", "ci", "--backend", "gloo",
                               "--report-dir", out], capture_output=True, text=True, check=False,
                              # A run 5x over budget is a finding, not a reason to wait forever.
                              timeout=BUDGET_S * 5)
        return time.perf_counter() - start, proc.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--against", default=None, metavar="PYTHON",
                        help="another checkout's interpreter, run alternately with this one")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error(f"--repeat {args.repeat} must be at least 1")
    sides = {"this": sys.executable} | ({"against": args.against} if args.against else {})
    walls: dict[str, list[float]] = {side: [] for side in sides}
    for i in range(args.repeat):
        # Alternate, and swap which side goes first each round: the first run of a pair also
        # warms the page cache for the second.
        order = list(sides) if i % 2 == 0 else list(reversed(sides))
        for side in order:
            wall, code = one_run(sides[side])
            walls[side].append(wall)
            print(f"run {i + 1} ({side}): {wall:.1f} s (exit {code}), ratio to {BUDGET_S:.0f} s "
                  f"budget: {wall / BUDGET_S:.2f}", flush=True)
    median = statistics.median(walls["this"])
    print(f"ci subset wall time: median {median:.1f} s; ratio {median / BUDGET_S:.2f} "
          f"({'within' if median < BUDGET_S else 'OVER'} budget)")
    if args.against:
        other = statistics.median(walls["against"])
        print(f"against {args.against}: median {other:.1f} s")
        print(f"ratio_vs_against: {median / other:.2f}")


if __name__ == "__main__":
    main()
