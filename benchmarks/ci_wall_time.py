"""Wall time of the CI subset against its 2-minute budget (`--suite ci` < 120 s on 2 cores; README, "Development").

    python benchmarks/ci_wall_time.py                 # one run, gloo, 2 ranks
    python benchmarks/ci_wall_time.py --repeat 3      # median of 3

Prints each run's wall time and the ratio to the budget (< 1.0 is within budget). Absolute
times vary between machines; the ratio on a 2-core machine is the number CI cares about.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time

BUDGET_S = 120.0


def one_run() -> tuple[float, int]:
    with tempfile.TemporaryDirectory(prefix="ci-wall-") as out:
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "conformance", "run", "--suite", "ci", "--backend", "gloo",
                               "--report-dir", out], capture_output=True, text=True, check=False,
                              # A run 5x over budget is a finding, not a reason to wait forever.
                              timeout=BUDGET_S * 5)
        return time.perf_counter() - start, proc.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    walls = []
    for i in range(args.repeat):
        wall, code = one_run()
        walls.append(wall)
        print(f"run {i + 1}: {wall:.1f} s (exit {code}), ratio to {BUDGET_S:.0f} s budget: {wall / BUDGET_S:.2f}")
    median = statistics.median(walls)
    print(f"ci subset wall time: median {median:.1f} s; ratio {median / BUDGET_S:.2f} "
          f"({'within' if median < BUDGET_S else 'OVER'} budget)")


if __name__ == "__main__":
    main()
