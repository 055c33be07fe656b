"""PyTorch's own flight recorder, read inside a rank: torch's view of entered vs completed.

torch 2.13 records gloo collectives natively in the process-wide ``FlightRecorder<c10::Event>``
ring buffer (on by default; ``TORCH_FR_BUFFER_SIZE`` sizes it) and dumps it with
``torch._C._distributed_c10d._dump_fr_trace_json()``; NCCL has its own recorder, dumped by
``_dump_nccl_trace_json()`` (``TORCH_NCCL_TRACE_BUFFER_SIZE``). Measured on torch 2.13 CPU with
gloo: an entry's ``retired`` flag means its work *ended*, failed or not (a timed-out all-reduce
was seen retired), and ``state`` stays "scheduled", so neither says "completed"; the per-group
``pg_status`` (``last_enqueued_collective`` vs ``last_completed_collective``) does, and that is
what this module reads. See pytorch/pytorch#189363 ("like Gloo's native recording ... an entry's
completion signal is the retired flag") for the recorder's design.

And gloo counts a collective as completed when its work *ends*: once the process-group
timeout has failed it, ``last_completed_collective`` catches up (measured: a dump taken right
after the timeout error showed it still pending in some runs and completed in others). So the
recorder only tells "entered, never completed" while the collective is still in flight:
:class:`InFlightSnapshot` dumps it from a side thread once one of the tracker's collectives has
been pending for a while, before the timeout ends it, as NCCL's watchdog dumps on a timeout.

The recorder lives in the rank's memory: a rank that is dead or frozen cannot be asked, and
the supervisor kills a hung world. So each rank that still answers hands its dump back with
its results, and the suite's file-based :mod:`faults.tracker` remains the record that
survives a kill; the two are compared by :func:`faults.diagnosis.diagnose_hang`.

    with InFlightSnapshot(tracker, "gloo", since_ns=time.time_ns(), groups=[group.group_name],
                          after_s=1.0) as snap:
        run_the_scenario()
    evidence = snap.result()
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Iterable

from conformance.harness.timing import FLIGHT_THREAD_JOIN_S

# Entries kept per rank in the evidence: enough to show the stuck collective and the few that
# completed before it, small enough for a report.
LAST_ENTRIES = 8


def dump(backend: str) -> dict[str, Any] | None:
    """This process's flight-recorder dump as a dict, or None where torch has none.

    Under NCCL both recorders are read and merged (entries and per-group status; group names
    are unique across backends): the scenarios' subgroups and the side group are gloo even in
    an NCCL world. Guarded on purpose: these are private torch APIs
    (``torch._C._distributed_c10d``) that move between releases; a missing or failing dump
    must never turn a diagnosis into an error.
    """
    try:
        import torch._C._distributed_c10d as c10d
    except ImportError:
        return None
    names = ("_dump_fr_trace_json", "_dump_nccl_trace_json") if backend == "nccl" else ("_dump_fr_trace_json",)
    merged: dict[str, Any] | None = None
    for name in names:
        fn = getattr(c10d, name, None)
        if fn is None:
            continue
        try:
            raw = fn()
            part = json.loads(raw.decode() if isinstance(raw, bytes) else raw)
        except Exception:  # a recorder that is off or cannot serialise: no evidence, no error
            continue
        if merged is None:
            merged = {**part, "entries": list(part.get("entries") or []),
                      "pg_status": dict(part.get("pg_status") or {})}
        else:
            merged["entries"] += part.get("entries") or []
            merged["pg_status"].update(part.get("pg_status") or {})
    return merged


def _int(value: Any, default: int = 0) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def summarize(raw: dict[str, Any] | None, *, since_ns: int = 0, groups: Iterable[str] = (),
              last: int = LAST_ENTRIES) -> dict[str, Any] | None:
    """The recorder's answer about one scenario: for each process group in ``groups`` (names)
    or with an entry created at/after ``since_ns`` (``time.time_ns()``), the last enqueued and
    last completed collective sequence numbers and the first collective entered but never
    completed (``pending``); and the last ``last`` of those entries.

    Groups with no entry since ``since_ns`` are left out: the recorder is process-wide, and a
    group an earlier scenario left hung would otherwise show its stale pending collective.
    """
    if not raw:
        return None
    entries = []
    for e in raw.get("entries") or []:
        if _int(e.get("time_created_ns")) < since_ns:
            continue
        pg = str((e.get("process_group") or [e.get("pg_id")])[0])
        entries.append({"pg": pg, "seq": _int(e.get("collective_seq_id")), "op": e.get("profiling_name"),
                        "input_sizes": e.get("input_sizes"), "state": e.get("state"),
                        "retired": e.get("retired"), "p2p": bool(e.get("is_p2p"))})
    wanted = {str(g) for g in groups} | {e["pg"] for e in entries}
    out: dict[str, Any] = {"version": raw.get("version"), "groups": {}, "entries": entries[-last:]}
    for pg, st in (raw.get("pg_status") or {}).items():
        if str(pg) not in wanted:
            continue
        enq, done = _int(st.get("last_enqueued_collective"), -1), _int(st.get("last_completed_collective"), -1)
        pending = next((e for e in entries if e["pg"] == str(pg) and not e["p2p"] and e["seq"] > done), None)
        out["groups"][str(pg)] = {"last_enqueued": enq, "last_completed": done, "pending": pending}
    return out


def pending(summary: dict[str, Any] | None) -> dict[str, Any] | None:
    """The first collective this rank's recorder shows entered and never completed, if any."""
    for group in (summary or {}).get("groups", {}).values():
        if group["last_enqueued"] > group["last_completed"]:
            return group["pending"] or {"seq": group["last_completed"] + 1, "op": None, "input_sizes": None}
    return None


class InFlightSnapshot:
    """Dump the recorder while a collective is stuck, not after its timeout retired it.

    A daemon thread polls the rank's :class:`~faults.tracker.CollectiveTracker`; once its
    oldest open collective has been in flight for ``after_s`` (well past a healthy collective,
    well before the process-group timeout), it takes one summary for that collective.
    :meth:`result` returns that snapshot if the collective indeed never completed, else a dump
    taken at the end (a slow collective that did complete must not be reported as stuck).
    """

    def __init__(self, tracker: Any, backend: str, *, since_ns: int, groups: Iterable[str] = (),
                 after_s: float = 1.0, poll_s: float = 0.1) -> None:
        self.tracker, self.backend = tracker, backend
        self.since_ns, self.groups = since_ns, list(groups)
        self.after_s, self.poll_s = after_s, poll_s
        self._snap: tuple[int, float, dict[str, Any] | None] | None = None  # (seq, age, summary)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="fr-snapshot", daemon=True)

    def _take(self) -> dict[str, Any] | None:
        return summarize(dump(self.backend), since_ns=self.since_ns, groups=self.groups)

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            oldest = self.tracker.oldest_open()
            if oldest is None:
                continue
            seq, enqueued = oldest
            age = time.perf_counter() - enqueued
            if age >= self.after_s and (self._snap is None or self._snap[0] != seq):
                self._snap = (seq, age, self._take())

    def __enter__(self) -> InFlightSnapshot:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        # Bounded: a daemon thread stuck in a dump must not keep the rank from answering.
        self._thread.join(timeout=FLIGHT_THREAD_JOIN_S)

    def result(self) -> dict[str, Any] | None:
        snap = self._snap
        done = {line["seq"] for line in self.tracker.records if line.get("event") == "completed"}
        if snap is not None and snap[2] is not None and snap[0] not in done:
            return {**snap[2], "taken": f"in flight, {snap[1]:.1f} s after collective #{snap[0]} was entered"}
        final = self._take()
        return {**final, "taken": "after the scenario"} if final is not None else None
