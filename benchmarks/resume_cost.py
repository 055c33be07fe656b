"""What resume-equivalence costs over the one run it replaces: the check's time / the
uninterrupted run's time (a fresh world started and the target's run_loop run to ctx.steps).

    python benchmarks/resume_cost.py                                  # examples/train_resume.py, 3 repeats
    python benchmarks/resume_cost.py --target my_target.py --repeats 1

The check runs three lives (uninterrupted, which also gives both kill scenarios their first
lives: its checkpoint folder copied at each kill point; then each scenario's restart, one
after the other), each in a fresh world whose start is the floor of a restart; the world for
the next life is launched while one runs. Both sides are timed in one session,
alternating, and the medians compared, after one untimed round (the zygotes' start, which
only a session's first worlds pay). The uninterrupted side runs in the same kind of world as the check's
lives (CPU: ranks forked from the zygote, conformance/harness/world/_zygote.py); it is also
timed in a spawned world (``DDP_CONFORMANCE_START=spawn``: every rank a fresh interpreter, as a
production launcher starts them), printed as ``ratio vs spawned``. The last line is
``ratio: <check / uninterrupted>`` (want <= 3).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from conformance.checks.resume import UNINTERRUPTED, KillPlan, Lives  # noqa: E402
from conformance.checks.resume_equivalence import EVERY, STEPS  # noqa: E402
from conformance.harness.registry import BY_ID  # noqa: E402
from conformance.harness.session import PERSISTENT_PRELOAD, Session, Settings  # noqa: E402
from conformance.harness.timing import MIDRUN_PG_TIMEOUT_S  # noqa: E402
from conformance.harness.world import World  # noqa: E402
from conformance.harness.world._zygote import START_ENV  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def uninterrupted(spec: str, world_size: int, deadline: float) -> float:
    """One fresh world and one uninterrupted life, as the check's first life runs it (the same
    world: the suite's preload, and its ranks forked from the same zygote)."""
    def world() -> World:
        return World(world_size, "gloo", deadline=deadline, pg_timeout=MIDRUN_PG_TIMEOUT_S,
                     preload=PERSISTENT_PRELOAD)

    with tempfile.TemporaryDirectory() as folder:
        started = time.perf_counter()
        with Lives(world, spec, Path(folder), STEPS, EVERY, deadline) as lives:
            _, failure = lives.one(UNINTERRUPTED, 1, KillPlan("none"), world_size)
        elapsed = time.perf_counter() - started
    if failure is not None:
        raise SystemExit(f"the uninterrupted run failed: {failure}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=str(ROOT / "examples" / "train_resume.py"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--world-size", type=int, default=2)
    args = parser.parse_args()
    deadline = 120.0
    session = Session(Settings(backend="gloo", world_size=args.world_size, deadline=deadline))
    checks, plain, spawned = [], [], []
    try:
        # Not timed: the session's first worlds start the zygotes (their torch import, seconds),
        # which only a session's first world pays; in a timed repeat it would inflate one side.
        uninterrupted(args.target, args.world_size, deadline)
        session.run_check(BY_ID["resume-equivalence"], args.target)
        for i in range(args.repeats):
            plain.append(uninterrupted(args.target, args.world_size, deadline))
            os.environ[START_ENV] = "spawn"
            try:
                spawned.append(uninterrupted(args.target, args.world_size, deadline))
            finally:
                del os.environ[START_ENV]
            started = time.perf_counter()
            record, _ = session.run_check(BY_ID["resume-equivalence"], args.target)
            checks.append(time.perf_counter() - started)
            print(f"repeat {i + 1}: uninterrupted {plain[-1]:.2f} s (spawned world {spawned[-1]:.2f} s), "
                  f"check {checks[-1]:.2f} s ({record.status})", flush=True)
            if record.status != "passed":
                print(f"  {record.message[:300]}")
    finally:
        session.close()
    check, base = statistics.median(checks), statistics.median(plain)
    print(f"median: uninterrupted {base:.2f} s (spawned world {statistics.median(spawned):.2f} s), check {check:.2f} s")
    print(f"ratio vs spawned: {check / statistics.median(spawned):.2f}")
    print(f"ratio: {check / base:.2f}")


if __name__ == "__main__":
    main()
