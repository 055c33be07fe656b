"""Judges of the chaos checks: turn what the ranks saw into a named culprit.

Pure functions over plain data (DDP error text, collective logs, timings), so the diagnosis
is unit-tested without a world and the same code judges injected faults and user targets.
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, TypedDict

from . import _flight

_UNUSED_NAMES = re.compile(r"Parameters which did not receive grad for rank (\d+): ([^\n]+)")
_UNUSED_INDICES = re.compile(r"Parameter indices which did not receive grad for rank (\d+): ([\d ]+)")
_BARRIER = re.compile(r"Ranks? ([\d, ]+) failed to pass monitoredBarrier")


def unused_from_error(text: str) -> dict[int, list[str]]:
    """Parameter names per rank from DDP's "did not receive grad" error (needs DEBUG>=INFO);
    falls back to ``#index`` strings where only indices were printed."""
    found: dict[int, list[str]] = {}
    for rank, names in _UNUSED_NAMES.findall(text):
        found[int(rank)] = sorted(n.strip() for n in names.split(",") if n.strip())
    for rank, idx in _UNUSED_INDICES.findall(text):
        found.setdefault(int(rank), [f"#{i}" for i in idx.split()])
    return found


def barrier_culprits(text: str) -> list[int]:
    """Ranks a ``monitored_barrier`` named as not reaching it (alive but stuck elsewhere)."""
    match = _BARRIER.search(text)
    return [int(r) for r in re.findall(r"\d+", match.group(1))] if match else []


# -- hangs ---------------------------------------------------------------------------------

CLASSES = ("divergence", "transport", "dead-rank", "error", "none")


@dataclass(frozen=True, slots=True)
class RankState:
    """How one rank ended a scenario: "ok", "raised" (text), "died" (exit code), "stuck"."""

    rank: int
    state: str
    text: str = ""
    exitcode: int | None = None


@dataclass(frozen=True, slots=True)
class HangDiagnosis:
    classification: str  # one of CLASSES
    kind: str  # never-entered | skipped-collective | shape-mismatch | dead | entered-never-completed | ...
    culprit_rank: int | None
    collective: dict[str, Any] = field(default_factory=dict)  # seq, op, shape, tag, bucket
    params: list[str] = field(default_factory=list)  # the stuck bucket's parameter names
    unused: dict[int, list[str]] = field(default_factory=dict)  # from DDP's error text
    barrier: list[int] = field(default_factory=list)  # ranks the monitored barrier named
    detail: str = ""
    # Per rank that could still answer: the collective torch's flight recorder shows entered
    # and never completed (None: everything it entered completed). A second, independent
    # source for "entered vs completed" next to the suite's tracker.
    flight: dict[int, dict[str, Any] | None] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.classification not in CLASSES:
            raise ValueError(f"classification={self.classification!r} is not one of {CLASSES}")

    def describe(self) -> str:
        if self.classification == "none":
            return "no hang: every rank completed every collective"
        where = ""
        if self.collective:
            c = self.collective
            where = f" at collective #{c.get('seq')} {c.get('op')}{c.get('shape')} ({c.get('tag')})"
        bucket = ""
        if self.collective.get("bucket") is not None:
            bucket = f"; DDP bucket {self.collective['bucket']} holds {', '.join(self.params)}"
        unused = "".join(f"; rank {r} produced no grad for {', '.join(n)}" for r, n in sorted(self.unused.items()))
        who = f"rank {self.culprit_rank}" if self.culprit_rank is not None else "no single rank"
        return f"{self.classification} ({self.kind}): culprit {who}{where}{bucket}{unused}. {self.detail}".strip()

    def as_dict(self) -> dict[str, Any]:
        return {"classification": self.classification, "kind": self.kind,
                "culprit_rank": self.culprit_rank, "collective": self.collective,
                "params": self.params, "unused": {str(k): v for k, v in self.unused.items()},
                "barrier": self.barrier, "detail": self.detail,
                "flight_recorder": {str(k): v for k, v in self.flight.items()}}


class _Seen(TypedDict):
    """What every diagnosis carries besides its verdict: read from the ranks' texts and recorders."""

    unused: dict[int, list[str]]
    barrier: list[int]
    flight: dict[int, dict[str, Any] | None]


def _enqueued(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in lines if line.get("event") == "enqueued"]


def _completed(lines: list[dict[str, Any]]) -> set[int]:
    return {line["seq"] for line in lines if line.get("event") == "completed"}


def _mismatch(logs: dict[int, list[dict[str, Any]]]) -> HangDiagnosis | None:
    """First sequence number at which ranks issued different collectives (tag, op or shape)."""
    seqs = {r: _enqueued(lines) for r, lines in logs.items()}
    depth = min((len(s) for s in seqs.values()), default=0)
    for k in range(depth):
        entries = {r: s[k] for r, s in seqs.items()}
        keys = {r: (e["op"], tuple(e["shape"]), e["tag"]) for r, e in entries.items()}
        if len(set(keys.values())) == 1:
            continue
        tags = {r: e["tag"] for r, e in entries.items()}
        if len(set(tags.values())) > 1:
            # Someone skipped: the culprit is a rank that never issued a tag its peers issued.
            issued = {r: {e["tag"] for e in s} for r, s in seqs.items()}
            for r in sorted(entries):
                others = {t for o, tag in tags.items() if o != r for t in [tag]}
                missing = sorted(t for t in others if t not in issued[r])
                if missing:
                    ref = next(e for o, e in entries.items() if e["tag"] == missing[0])
                    return HangDiagnosis(
                        "divergence", "skipped-collective", r, _collective(ref),
                        list(ref.get("params") or []),
                        detail=(f"rank {r} never issued collective {missing[0]!r}; its later "
                                f"collectives paired with the wrong ones on its peers (results "
                                f"silently mixed) until one was left without a partner"))
        # Same tag, different shape: the odd one out is the rank whose shape is rare overall.
        shape_use = Counter(tuple(e["shape"]) for s in seqs.values() for e in s)
        culprit = min(entries, key=lambda r: (shape_use[tuple(entries[r]["shape"])], -r))
        shapes = ", ".join(f"rank {r} {e['op']}{e['shape']}" for r, e in sorted(entries.items()))
        return HangDiagnosis("divergence", "shape-mismatch", culprit, _collective(entries[culprit]),
                             detail=f"collective #{k + 1} differs across ranks: {shapes}")
    return None


def _collective(entry: dict[str, Any]) -> dict[str, Any]:
    return {k: entry.get(k) for k in ("seq", "op", "shape", "tag", "bucket", "step")}


def _frozen(stuck: list[int], states: list[RankState]) -> int | None:
    """The one rank among ``stuck`` (all inside the collective) that never came back while a
    peer did: the peers were released by their process-group timeout and returned; a rank that
    no timeout released is frozen (stopped, wedged in the driver). None when it is ambiguous."""
    by_rank = {s.rank: s.state for s in states}
    silent = [r for r in stuck if by_rank.get(r) == "stuck"]
    answered = [r for r in stuck if by_rank.get(r) in ("raised", "ok")]
    return silent[0] if len(silent) == 1 and answered else None


def _flight_note(flight: dict[int, dict[str, Any] | None], tracker_pending: set[int]) -> str:
    """What torch's recorder says, rank by rank, and whether it agrees with the tracker."""
    notes = []
    for rank, entry in sorted(flight.items()):
        if entry is None:
            notes.append(f"rank {rank} completed everything it entered"
                         + (" (the tracker disagrees)" if rank in tracker_pending else ""))
            continue
        agrees = "" if rank in tracker_pending else " (the tracker disagrees)"
        notes.append(f"rank {rank} entered {entry.get('op')} #{entry.get('seq')} {entry.get('input_sizes')} "
                     f"and never completed it{agrees}")
    return f" Flight recorder: {'; '.join(notes)}." if notes else ""


def diagnose_hang(logs: dict[int, list[dict[str, Any]]], states: list[RankState], *,
                  flight: dict[int, dict[str, Any]] | None = None) -> HangDiagnosis:
    """Name the culprit of a hang/failure from the ranks' collective logs and end states.

    ``flight`` is each answering rank's flight-recorder summary (:func:`faults._flight.summarize`);
    it corroborates "entered vs completed" and is reported, but the tracker's logs decide: they
    also cover the ranks that died or froze, whose recorder died with them.
    """
    unused: dict[int, list[str]] = {}
    barrier: list[int] = []
    for s in states:
        unused.update(unused_from_error(s.text))
        barrier = barrier or barrier_culprits(s.text)
    recorded = {r: _flight.pending(summary) for r, summary in (flight or {}).items() if summary}
    extra = _Seen(unused=unused, barrier=barrier, flight=recorded)
    mismatch = _mismatch(logs)
    if mismatch is not None:
        return HangDiagnosis(mismatch.classification, mismatch.kind, mismatch.culprit_rank,
                             mismatch.collective, mismatch.params, detail=mismatch.detail, **extra)
    enq = {r: _enqueued(lines) for r, lines in logs.items()}
    last = {r: (e[-1]["seq"] if e else 0) for r, e in enq.items()}
    top = max(last.values(), default=0)

    def pending_of(rank: int) -> dict[str, Any] | None:
        done = _completed(logs.get(rank, []))
        waiting = [e for e in enq.get(rank, []) if e["seq"] not in done]
        return waiting[0] if waiting else None

    dead = [s for s in states if s.state == "died"]
    if dead:
        culprit = dead[0].rank
        peer = next((pending_of(r) for r in sorted(enq) if r != culprit and pending_of(r)), None)
        how = f"exit code {dead[0].exitcode}" if (dead[0].exitcode or 0) >= 0 else f"signal {-(dead[0].exitcode or 0)}"
        return HangDiagnosis("dead-rank", "dead", culprit, _collective(peer) if peer else {},
                             list(peer.get("params") or []) if peer else [],
                             detail=f"rank {culprit} died ({how}); its peers saw the connection drop", **extra)
    behind = sorted(r for r, n in last.items() if n < top)
    if behind:
        culprit = behind[0]
        ref = next(e for r in sorted(enq) for e in enq[r] if e["seq"] == last[culprit] + 1)
        why = "it raised before reaching it" if any(s.rank == culprit and s.state == "raised" for s in states) \
            else "it had left the loop (fewer batches)" if any(s.rank == culprit and s.state == "ok" for s in states) \
            else "it was elsewhere"
        return HangDiagnosis("divergence", "never-entered", culprit, _collective(ref),
                             list(ref.get("params") or []),
                             detail=f"rank {culprit} never entered collective #{ref['seq']}: {why}", **extra)
    stuck = sorted(r for r in enq if pending_of(r) is not None)
    if stuck:
        ref = pending_of(stuck[0]) or {}
        # Every rank entered; who stalled it? The monitored barrier on the side group names a
        # rank that is alive but never arrives (a SIGSTOPped process counts: it holds its
        # connections open). Rank 0 collects the barrier's acks, so it cannot name itself:
        # then the rank that never came back while its peers' timeouts released them is the one.
        frozen = _frozen(stuck, states)
        stalled = barrier[0] if barrier else frozen
        named = (" (named by the monitored barrier)" if barrier else
                 " (the only rank no timeout released)" if frozen is not None else "")
        who = f"; rank {stalled} stalled inside it{named}" if stalled is not None else ""
        return HangDiagnosis("transport", "entered-never-completed", stalled,
                             _collective(ref), list(ref.get("params") or []),
                             detail=(f"ranks {stuck} entered collective #{ref.get('seq')} and it never "
                                     f"completed{who}.{_flight_note(recorded, set(stuck))}"),
                             **extra)
    failed = [s for s in states if s.state in ("raised", "stuck")]
    if failed:
        first = failed[0]
        lines = [ln for ln in first.text.strip().splitlines() if not ln.startswith("monitored_barrier")]
        return HangDiagnosis("error", "raised" if first.state == "raised" else "stuck-outside-collectives",
                             first.rank, detail=" ".join(lines)[:400], **extra)
    return HangDiagnosis("none", "none", None, **extra)


# -- stragglers ------------------------------------------------------------------------------

# A rank whose extra compute costs every rank a quarter of its step is a clear straggler:
# below that, scheduling noise on a shared CPU host and natural data imbalance reach it.
STRAGGLER_THRESHOLD = 0.25


@dataclass(frozen=True, slots=True)
class StragglerVerdict:
    per_rank: list[dict[str, Any]]
    culprit_rank: int | None
    cost_s: float  # extra compute of the culprit per step = what every rank waits
    step_s: float

    @property
    def clear(self) -> bool:
        return self.culprit_rank is not None


def score_stragglers(compute: dict[int, list[float]], wait: dict[int, list[float]],
                     step: dict[int, list[float]], threshold: float = STRAGGLER_THRESHOLD) -> StragglerVerdict:
    """Per-rank median compute and wait; score = (compute - fastest compute) / median step.

    Step time cannot find the culprit (every rank inflates to the slowest one's pace); the
    culprit is the rank with the most compute and the least wait.
    """
    med_c = {r: statistics.median(v) for r, v in compute.items()}
    med_w = {r: statistics.median(v) for r, v in wait.items()}
    step_s = statistics.median([x for v in step.values() for x in v])
    fastest = min(med_c.values())
    per_rank: list[dict[str, Any]] = [{"rank": r, "compute_s": round(med_c[r], 6), "wait_s": round(med_w[r], 6),
                 "score": round((med_c[r] - fastest) / step_s, 4) if step_s > 0 else 0.0}
                for r in sorted(med_c)]
    top = max(per_rank, key=lambda d: d["score"])
    least_wait = min(per_rank, key=lambda d: d["wait_s"])
    culprit = top["rank"] if top["score"] > threshold and least_wait["rank"] == top["rank"] else None
    others = [med_c[r] for r in med_c if r != top["rank"]] or [fastest]
    cost = med_c[top["rank"]] - statistics.median(others)
    return StragglerVerdict(per_rank, culprit, round(cost, 6), round(step_s, 6))
