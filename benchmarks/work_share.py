"""How much of a check's time is the training its design runs (benchmarks/model_scale.py --work).

The stack sampler (``stack_sampler/sitecustomize.py``) writes, per rank process, the time spent
under each Python stack. A sample is *work* when its stack is inside the target's own step:
the harness's calls of ``train_step``/``compute_loss`` (``harness/targets/calls.py``) or an
autograd backward -- the forwards, backwards, all-reduces and optimizer steps a check's design
runs (its steps, microbatches, timed repetitions, warm-ups, profile and discovery passes) --
and not in the suite's own instruments that run inside those calls (comparisons against the
reference, digests, float64 norms, snapshot writes, parameter fingerprints). Everything else a
rank does for the check (building the model, DDP's construction broadcast, probes, judging
inputs) is the check's overhead, as is the supervisor's time.

A check's work in seconds: the 1-rank reference's (it runs alone, before the ranks) plus the
other processes' summed over and divided by the world size (the ranks of a world run at once,
fresh worlds' ranks included).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

#: Frames (``file.py:function``) of the target's own step as the harness calls it.
WORK = ("calls.py:run_step", "calls.py:accumulate_step", "calls.py:compute_loss", "_tensor.py:backward")
#: Frames of the suite's instruments that run inside those calls: overhead, not work.
INSTRUMENTS = ("compare_snapshot", "norm64", "sum64", "digest", "first_nonfinite", "_fingerprint",
               "snapshots.py:", "probes.py:record", "tracker.py:")
#: Frames of a rank waiting for its next call: neither.
IDLE = ("connection.py:_recv", "selectors.py:")


def read(folder: Path) -> dict[int, Counter[str]]:
    """pid -> {"busy": µs, "work": µs} so far, from the sampler's files."""
    out: dict[int, Counter[str]] = {}
    for path in folder.glob("*.txt"):
        seen: Counter[str] = Counter()
        for line in path.read_text().splitlines():
            micros, _, stack = line.partition(" ")
            if not stack or "rank_main" not in stack or stack.rsplit(";", 1)[-1].startswith(IDLE):
                continue
            seen["busy"] += int(micros)
            if any(f in stack for f in WORK) and not any(f in stack for f in INSTRUMENTS):
                seen["work"] += int(micros)
        out[int(path.stem)] = seen
    return out


def work_seconds(before: dict[int, Counter[str]], after: dict[int, Counter[str]], *, reference: set[int],
                 world_size: int) -> float:
    """A check's work between two readings: the reference's, plus the others' / world_size."""
    ref = other = 0
    for pid, seen in after.items():
        done = seen["work"] - before.get(pid, Counter())["work"]
        if pid in reference:
            ref += done
        else:
            other += done
    return (ref + other / world_size) / 1e6
