"""Wall time of the CI subset against its 2-minute budget (`--suite ci` < 120 s on 2 cores; README, "Development").

    python benchmarks/ci_wall_time.py                 # one run, gloo, 2 ranks
    python benchmarks/ci_wall_time.py --repeat 3      # median of 3
    python benchmarks/ci_wall_time.py --repeat 3 --against ../base/.venv/bin/python
                                                      # side by side with another checkout
    python benchmarks/ci_wall_time.py --repeat 3 --full   # and the full suite, alternated

Prints each run's wall time and the ratio to the budget (< 1.0 is within budget). Absolute
times vary between machines; the ratio on a 2-core machine is the number CI cares about.

``--against PYTHON`` runs the same subset with another interpreter (the virtualenv of another
checkout, e.g. the main before a change), alternating the two run by run so that a host's
load drifts over both alike, and prints ``ratio_vs_against``: this tree's median over the
other's. That ratio, not two absolute times taken minutes apart, is what a change is judged by.

``--full`` also times the full suite on the built-ins (alternated with ci the same way) and
prints ``ci_over_full``: the CI subset's median over the full suite's (the subset's promise:
at most 0.5), and each suite's median ``startup_s`` (report.json: the worlds' start before
the first check, outside every check's time).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time

BUDGET_S = 120.0


def one_run(python: str = sys.executable, *, suite: str = "ci") -> tuple[float, int, float | None]:
    """(wall seconds, exit code, the report's startup_s) of one run of ``suite``."""
    with tempfile.TemporaryDirectory(prefix="ci-wall-") as out:
        start = time.perf_counter()
        proc = subprocess.run([python, "-m", "conformance", "run", "--suite", suite, "--backend", "gloo",
                               "--report-dir", out], capture_output=True, text=True, check=False,
                              # A run 5x over budget is a finding, not a reason to wait forever.
                              timeout=BUDGET_S * 5)
        wall = time.perf_counter() - start
        try:
            with open(f"{out}/report.json", encoding="utf-8") as f:
                startup = json.load(f).get("startup_s")
        except (OSError, ValueError):
            startup = None
        return wall, proc.returncode, startup


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--against", default=None, metavar="PYTHON",
                        help="another checkout's interpreter, run alternately with this one")
    parser.add_argument("--full", action="store_true",
                        help="also time the full suite and print ci_over_full")
    args = parser.parse_args()
    if args.repeat < 1:
        parser.error(f"--repeat {args.repeat} must be at least 1")
    sides = {"this": (sys.executable, "ci")} | ({"against": (args.against, "ci")} if args.against else {}) \
        | ({"full": (sys.executable, "full")} if args.full else {})
    walls: dict[str, list[float]] = {side: [] for side in sides}
    startups: dict[str, list[float]] = {side: [] for side in sides}
    for i in range(args.repeat):
        # Alternate, and swap which side goes first each round: the first run of a pair also
        # warms the page cache for the second.
        order = list(sides) if i % 2 == 0 else list(reversed(sides))
        for side in order:
            python, suite = sides[side]
            wall, code, startup = one_run(python, suite=suite)
            walls[side].append(wall)
            if startup is not None:
                startups[side].append(startup)
            shown = f", startup {startup:.1f} s" if startup is not None else ""
            print(f"run {i + 1} ({side}, --suite {suite}): {wall:.1f} s (exit {code}{shown}), ratio to "
                  f"{BUDGET_S:.0f} s budget: {wall / BUDGET_S:.2f}", flush=True)
    median = statistics.median(walls["this"])
    print(f"ci subset wall time: median {median:.1f} s; ratio {median / BUDGET_S:.2f} "
          f"({'within' if median < BUDGET_S else 'OVER'} budget)")
    for side in sides:
        if startups[side]:
            print(f"startup_s ({side}): median {statistics.median(startups[side]):.1f} s")
    if args.against:
        other = statistics.median(walls["against"])
        print(f"against {args.against}: median {other:.1f} s")
        print(f"ratio_vs_against: {median / other:.2f}")
    if args.full:
        full = statistics.median(walls["full"])
        print(f"full suite wall time: median {full:.1f} s")
        print(f"ci_over_full: {median / full:.2f}")


if __name__ == "__main__":
    main()
