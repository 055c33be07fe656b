"""The gate on a busy machine: the CI subset on the built-in targets, quiet and under CPU hogs.

    python benchmarks/under_load.py                        # --suite ci, 2 CPU hogs, gloo, 2 ranks
    python benchmarks/under_load.py --hogs 4 --memory      # heavier: 4 CPU hogs + a memory-bandwidth hog
    python benchmarks/under_load.py --suite full --checks straggler,bucket-config,hang-detection,allreduce-bandwidth
    python benchmarks/under_load.py --suite full --target mlp --checks straggler,bucket-config,hang-detection

Runs ``ddp-conformance run`` (no ``--target``: every built-in target, the chaos checks injecting
their faults into built-in vehicles) twice, side by side in one invocation: on the machine as it
is, then with ``--hogs`` CPU hogs at normal priority (conformance/harness/load.py). Prints each
check's verdict in both runs, the wall-time ratio, whether every chaos check of the run still
caught and diagnosed its injected faults under load, and last ``false_alarms: X``: the checks
that failed (or errored) under load. The built-ins are correct code, so every failure is a false
alarm; an ``inconclusive`` says the host was too noisy to tell and is not one (issue 24).

The machine's own load (other jobs) is printed with the numbers: "quiet" is the host as found.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tabulate import tabulate

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conformance.harness.load import busy  # noqa: E402

#: A run this long is a finding (several times the CI budget on 2 cores), not a reason to wait.
RUN_LIMIT_S = 1800.0


@dataclass(frozen=True)
class RunResult:
    wall_s: float
    exit_code: int
    verdict: str
    checks: list[dict[str, Any]]
    load_before: float  # the 1-minute load average when the run started
    stderr_tail: str


def one_run(suite: str, checks: str | None, deadline: str | None, target: str | None = None) -> RunResult:
    with tempfile.TemporaryDirectory(prefix="under-load-") as out:
        cmd = [sys.executable, "-m", "conformance", "run", "--suite", suite, "--backend", "gloo", "--report-dir", out]
        cmd += ["--checks", checks] if checks else []
        cmd += ["--deadline", deadline] if deadline else []
        cmd += ["--target", target] if target else []
        load_before = os.getloadavg()[0]
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=RUN_LIMIT_S)
        wall = time.perf_counter() - start
        report = Path(out) / "report.json"
        data = json.loads(report.read_text()) if report.exists() else {}
    return RunResult(wall, proc.returncode, data.get("verdict", "no report"), data.get("checks", []),
                     load_before, proc.stderr[-2000:])


def _key(record: dict[str, Any]) -> tuple[str, str]:
    return record["id"], record.get("target") or "-"


def _injected_caught(record: dict[str, Any]) -> str:
    """What a chaos check's record says about its injected faults."""
    m = record.get("metrics", {})
    if "scenarios" in m and "diagnosed" in m:
        return f"{m['diagnosed']}/{m['scenarios']} diagnosed"
    return str(m.get("key_figure", ""))


def report(quiet: RunResult, loaded: RunResult, load_line: str) -> int:
    rows = []
    by_key = {_key(r): r for r in quiet.checks}
    for rec in loaded.checks:
        q = by_key.get(_key(rec), {})
        rows.append([rec["id"], rec.get("target") or "-", q.get("status", "-"), rec["status"],
                     f"{q.get('duration_s', 0):.1f}", f"{rec['duration_s']:.1f}",
                     rec["message"][:90] if rec["status"] not in ("passed", "skipped") else ""])
    print(tabulate(rows, headers=["check", "target", "quiet", "under load", "quiet s", "loaded s", "message (loaded)"]))
    print()
    for name, r in (("quiet", quiet), ("under load", loaded)):
        print(f"{name}: {r.wall_s:.1f} s, exit {r.exit_code}, verdict {r.verdict}, "
              f"load average at start {r.load_before:.1f}")
        if not r.checks:
            print(f"  no report; stderr: {r.stderr_tail}")
    print(f"load: {load_line}")
    print(f"time ratio (under load / quiet): {loaded.wall_s / quiet.wall_s:.2f}")
    # Injected mode only (no --target: the chaos checks' records are on the "builtin" vehicles).
    chaos = [r for r in loaded.checks if "chaos" in r.get("kind", "") and r.get("target") == "builtin"]
    for rec in chaos:
        print(f"injected faults under load: {rec['id']}: {rec['status']} ({_injected_caught(rec)})")
    if chaos:
        caught = all(r["status"] == "passed" for r in chaos)
        print(f"every injected fault caught under load: {'yes' if caught else 'NO'}")
    alarms = [r for r in loaded.checks if r["status"] in ("failed", "error")]
    for rec in alarms:
        print(f"false alarm: {rec['id']} on {rec.get('target')}: {rec['message'][:300]}")
    if not loaded.checks:
        print("false alarm: the loaded run wrote no report")
    return len(alarms) + (0 if loaded.checks else 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", default="ci", choices=("ci", "full"))
    parser.add_argument("--checks", default=None, help="comma-separated check ids (default: the suite's)")
    parser.add_argument("--hogs", type=int, default=2, help="CPU hogs at normal priority (default 2)")
    parser.add_argument("--memory", action="store_true", help="add a memory-bandwidth hog")
    parser.add_argument("--deadline", default=None, help="--deadline of both runs (default: the CLI's)")
    parser.add_argument("--target", default=None, help="one target in target mode (default: every built-in, "
                                                       "the chaos checks injecting their faults)")
    args = parser.parse_args()
    quiet = one_run(args.suite, args.checks, args.deadline, args.target)
    with busy(args.hogs, memory=args.memory, limit_s=RUN_LIMIT_S + 60) as load:
        loaded = one_run(args.suite, args.checks, args.deadline, args.target)
        load_line = load.describe()
    alarms = report(quiet, loaded, load_line)
    print(f"false_alarms: {alarms}")


if __name__ == "__main__":
    main()
