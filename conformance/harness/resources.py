"""What a check cost: its time, the peak memory of the supervisor and of the whole process tree,
and the size of the model it ran on.

Why a sampler and not ``resource.getrusage``: ``ru_maxrss`` is the lifetime peak of a process
(or of its *waited-for* children), never reset between checks, so the second check of a session
would inherit the first one's peak, and the persistent world's ranks are never waited for until
the session ends. Instead:

- the supervisor's peak is exact: Linux keeps it as ``VmHWM`` in ``/proc/self/status`` and lets
  a process reset it (``echo 5 > /proc/self/clear_refs``), so every check starts from its own
  current RSS and a transient peak between two samples (a whole model unpickled at once) is
  still seen;
- the process tree's peak is the largest *sum* of the RSS of the supervisor and of every
  descendant (the ranks, a fresh world's ranks, what they started), sampled every
  :data:`SAMPLE_INTERVAL_S` by a daemon thread. A peak shorter than one interval can be missed;
  the sum of per-process peaks would over-count processes whose peaks never coincide;
- each descendant's own peak (a rank's, a reference's: what one device or one rank's share of
  the host must hold) is exact while it lives: the meter resets every descendant's ``VmHWM``
  at the check's start (``/proc/<pid>/clear_refs``, allowed for a process of the same user)
  and reads it at every sample, so a transient peak between samples is still seen; a process
  born during the check counts from its birth, one that exits counts up to its last sample.
  The zygotes (idle, forked from, never working) are left out.

The same thread says, every :data:`PROGRESS_EVERY_S`, that a long check is still running: users
watch a 10-minute GPU run and must not mistake it for a hang.

Linux only (``/proc``); elsewhere the memory figures are absent, never wrong.

And what a timing sweep can afford: :func:`agreed_reps`, run on the ranks, turns the measured
step time into a repetition count (timing.sweep_reps) that every rank shares.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ddp_conformance.reports.keys import (
    MODEL_BYTES,
    MODEL_PARAMETERS,
    PROCESS_PEAK_RSS,
    SUPERVISOR_PEAK_RSS,
    TREE_PEAK_RSS,
)

from .timing import sweep_reps

if TYPE_CHECKING:
    from .world import RankContext

#: How often the tree's RSS is summed. A check's memory rises over seconds (a model is built,
#: stepped, snapshotted); 0.2 s sees that and costs a few ms of /proc reads per sample on a
#: 2-core host shared by the ranks.
SAMPLE_INTERVAL_S = 0.2
#: The first progress line comes after this long, then one per this long: a check of a few
#: seconds stays silent, a long one says it is alive well before anyone wonders.
#: ``DDP_CONFORMANCE_PROGRESS_S`` sets another interval (a CI log that wants fewer lines, a
#: test that wants one sooner).
PROGRESS_EVERY_S = 10.0
PROGRESS_ENV = "DDP_CONFORMANCE_PROGRESS_S"

_PROC = Path("/proc")


def _status_kib(pid: int | str, field: str) -> int | None:
    """A ``kB`` field of ``/proc/<pid>/status`` (``VmRSS``, ``VmHWM``), in KiB; None if gone."""
    return _status_fields(pid, (field,)).get(field)


def _status_fields(pid: int | str, fields: tuple[str, ...]) -> dict[str, int]:
    """Several ``kB`` fields of ``/proc/<pid>/status`` in one read, in KiB; {} if gone."""
    out: dict[str, int] = {}
    try:
        with open(_PROC / str(pid) / "status") as fh:
            for line in fh:
                name = line.split(":", 1)[0]
                if name in fields:
                    out[name] = int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return {}
    return out


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (every thread's ``children`` file: a thread may spawn)."""
    out: list[int] = []
    try:
        tasks = os.listdir(_PROC / str(pid) / "task")
    except OSError:
        return out
    for tid in tasks:
        try:
            with open(_PROC / str(pid) / "task" / tid / "children") as fh:
                out += [int(c) for c in fh.read().split()]
        except (OSError, ValueError):
            continue
    return out


def available_memory() -> int | None:
    """The host's MemAvailable in bytes (None where /proc/meminfo does not say)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def tree_rss_bytes(root: int | None = None) -> int | None:
    """RSS of ``root`` (default: this process) and all its descendants, in bytes."""
    total, _ = _tree(root)
    return total


def _tree(root: int | None = None) -> tuple[int | None, dict[int, int]]:
    """(RSS of ``root`` and all its descendants, each descendant's VmHWM), in bytes; one read
    of ``status`` per process. (None, {}) when ``root`` is gone."""
    root = os.getpid() if root is None else root
    total, seen, todo = 0, set(), [root]
    peaks: dict[int, int] = {}
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        kib = _status_fields(pid, ("VmRSS", "VmHWM"))
        if "VmRSS" not in kib:
            if pid == root:
                return None, {}
            continue  # exited between the listing and the read
        total += kib["VmRSS"] * 1024
        if pid != root:
            peaks[pid] = max(kib["VmRSS"], kib.get("VmHWM", 0)) * 1024
        todo += _children(pid)
    return total, peaks


def reset_peak(pid: int | str = "self") -> bool:
    """Reset a process's VmHWM to its current RSS (Linux >= 4.0; another process: of the same
    user); False where refused or gone."""
    try:
        with open(_PROC / str(pid) / "clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def _reset_own_peak() -> bool:
    return reset_peak("self")


def _idle_helpers() -> set[int]:
    """Descendants that never work for a check (the zygotes the ranks are forked from)."""
    from .world._zygote import zygote_pids

    return set(zygote_pids())


@dataclass(frozen=True, slots=True)
class Cost:
    """What one check cost. Memory figures are None where /proc could not say."""

    duration_s: float
    supervisor_peak_rss: int | None
    tree_peak_rss: int | None
    #: Each process under the supervisor (a rank, a reference, what they started): its own peak
    #: RSS during the check, by pid. Empty where /proc could not say.
    process_peak_rss: dict[int, int] = field(default_factory=dict)

    def metrics(self) -> dict[str, Any]:
        return {SUPERVISOR_PEAK_RSS: self.supervisor_peak_rss, TREE_PEAK_RSS: self.tree_peak_rss,
                PROCESS_PEAK_RSS: {str(pid): peak for pid, peak in sorted(self.process_peak_rss.items())}}


def progress_interval() -> float:
    """:data:`PROGRESS_EVERY_S`, or the positive number of seconds in ``DDP_CONFORMANCE_PROGRESS_S``
    (anything else there is ignored: a progress line is never worth failing a run)."""
    try:
        value = float(os.environ.get(PROGRESS_ENV, ""))
    except ValueError:
        return PROGRESS_EVERY_S
    return value if value > 0 else PROGRESS_EVERY_S


class CostMeter:
    """``with CostMeter(label=...) as meter: ...`` then ``meter.cost``: time and peak memory of the
    block, with a progress line through ``progress`` every ``progress_every_s`` while it runs."""

    def __init__(self, *, label: str = "", progress: Callable[[str], None] | None = None,
                 interval_s: float | None = None, progress_every_s: float | None = None) -> None:
        self._label, self._progress = label, progress
        # Read when built, not when defined: a test may shorten the module's intervals.
        self._interval = SAMPLE_INTERVAL_S if interval_s is None else interval_s
        self._every = progress_interval() if progress_every_s is None else progress_every_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0
        self._own_peak: int | None = None
        self._tree_peak: int | None = None
        self._process_peaks: dict[int, int] = {}
        self._skip: set[int] = set()
        self._exact_own = False
        self.cost: Cost | None = None
        self.progress_lines = 0

    def _sample(self) -> None:
        own = _status_kib("self", "VmRSS")
        if own is not None:
            self._own_peak = max(self._own_peak or 0, own * 1024)
        tree, peaks = _tree()
        if tree is not None:
            self._tree_peak = max(self._tree_peak or 0, tree)
        for pid, peak in peaks.items():
            if pid not in self._skip:
                self._process_peaks[pid] = max(self._process_peaks.get(pid, 0), peak)

    def _loop(self) -> None:
        next_line = self._every
        while not self._stop.wait(self._interval):
            self._sample()
            elapsed = time.perf_counter() - self._t0
            if self._progress is not None and elapsed >= next_line:
                next_line += self._every
                self.progress_lines += 1
                try:
                    self._progress(f"{self._label}: running ({elapsed:.0f} s)…")
                except Exception:  # noqa: BLE001, S110 -- a broken terminal must not end the measurement
                    pass

    def __enter__(self) -> CostMeter:  # noqa: PYI034 -- a final class in practice
        self._exact_own = _reset_own_peak()
        self._skip = _idle_helpers()
        # Every descendant starts the check from its current RSS: a persistent rank's peak of
        # an earlier check is not this one's.
        for pid in _tree()[1]:
            reset_peak(pid)
        self._t0 = time.perf_counter()
        self._sample()
        # A daemon: a check that never returns (the supervisor is killed) never waits for it.
        self._thread = threading.Thread(target=self._loop, name="ddp-cost-meter", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        duration = time.perf_counter() - self._t0
        self._stop.set()
        if self._thread is not None:
            # The loop wakes at once on the event; one interval bounds a sample in progress.
            self._thread.join(timeout=max(1.0, 5 * self._interval))
        self._sample()
        own = self._own_peak
        if self._exact_own:
            hwm = _status_kib("self", "VmHWM")
            if hwm is not None:
                own = max(own or 0, hwm * 1024)
        tree = self._tree_peak
        if tree is not None and own is not None:
            tree = max(tree, own)  # the tree includes the supervisor's exact peak
        self.cost = Cost(duration_s=duration, supervisor_peak_rss=own, tree_peak_rss=tree,
                         process_peak_rss=dict(self._process_peaks))


_MODEL_SIZES: dict[str, tuple[int, int] | None] = {}


def model_size(target: Any) -> tuple[int, int] | None:
    """(parameters, bytes) of ``target.build_model()``, built on torch's ``meta`` device: shapes
    and dtypes only, no memory, so the supervisor never holds the model to count it. Cached per
    target spec; None when the model cannot be built there (a build that needs real storage)."""
    key = str(getattr(target, "spec", id(target)))
    if key not in _MODEL_SIZES:
        _MODEL_SIZES[key] = _measure_model(target)
    return _MODEL_SIZES[key]


def _measure_model(target: Any) -> tuple[int, int] | None:
    try:
        import torch

        with torch.device("meta"):
            model = target.build_model()
        params = [p for p in model.parameters()]
        return sum(p.numel() for p in params), sum(p.numel() * p.element_size() for p in params)
    except Exception:  # noqa: BLE001 -- any user build that fails on meta: size unknown
        return None


def model_size_on_rank(ctx: RankContext, target_spec: str) -> tuple[int, int] | None:
    """World work function: :func:`model_size` of the target, counted in a rank process.

    The supervisor never runs the user's ``build_model()`` itself: a build that loads a
    checkpoint (real tensors even under the meta device) or never returns would cost the
    supervisor memory or hang it outside every deadline; in a rank it is one call under the
    world's deadline."""
    from .targets import load_target

    return _measure_model(load_target(target_spec))


def size_metrics(size: tuple[int, int] | None) -> dict[str, Any]:
    """The model-size keys of a record's metrics (absent when unknown)."""
    if size is None:
        return {}
    return {MODEL_PARAMETERS: size[0], MODEL_BYTES: size[1]}


def agreed_reps(ctx: RankContext, step_s: float, *, points: int, deadline_s: float) -> tuple[int, float]:
    """On every rank of a sweep: (repetitions per point, the slowest rank's step time).

    The ranks of a sweep issue the same all-reduces in the same order, so a rank that chose
    more repetitions than its peers would wait forever in a collective they never join: they
    agree on the slowest rank's step (an all-reduce MAX), which the sweep must fit on every rank.
    """
    import torch
    import torch.distributed as dist

    slowest = torch.tensor([step_s], dtype=torch.float64, device=ctx.device)
    # Synchronisation point: every rank of the sweep calls this once, after the same warm-up.
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    step = float(slowest.item())
    return sweep_reps(step, points=points, deadline_s=deadline_s), step
