"""From every rank's node-health data to one outcome (pure: no world, no torch).

Order of judgement, each step able to end it:

1. a rank where bitwise agreement cannot hold (torch refused an op without a deterministic
   implementation; the cuBLAS setting missing) — inconclusive with the reason;
2. ranks that ran different work (``compare.STRUCTURE``), or a disagreement where the
   target's own forward read its rank (``rank_reads``) — inconclusive: a rank-dependent model
   or input, not a node fault;
3. a disagreement while the ranks' software or settings differ — inconclusive: the mismatch
   explains it without any fault (listed first);
4. every rank's own results changing from repeat to repeat — inconclusive: the work is not
   deterministic here; a disagreement without a majority (a pair, a set) where the target's
   forward or loss calls collectives — inconclusive: its results mix the ranks' data and may
   depend on the rank;
5. a disagreement — failed: the rank named by the majority (or the pair, or the set), where it
   first went wrong, the elements that differ and the largest difference, and in how many of
   the repeats (persistent: every repeat; transient: some);
6. an all-reduced bucket that differs between ranks — failed: the bucket, its parameters, the
   rank(s), and in how many of the repeats (persistent or transient);
7. else passed: the node is healthy, with what was compared.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from conformance.harness.outcome import Outcome
from ddp_conformance.reports.keys import CULPRIT_RANK, NODE_HEALTH, VERIFIED

from .compare import MAJORITY, PAIR, STRUCTURE
from .software import describe, mismatches
from .speed import LINK_FACTOR, SHARED_LINK_FACTOR, SHARED_SLOW_RATIO, SLOW_RATIO, judge_speed

#: How a slow pair is named (``NodeDiagnosis.how``).
LINK = "link"
#: What to run next on a rank the check names (the vendor's own diagnostic of the device).
DIAGNOSTIC = "dcgmi diag -r 3 (DCGM's long run) on its GPU, or the vendor's memory and core test"


@dataclass(frozen=True, slots=True)
class NodeDiagnosis:
    """What the judge concluded, for the injected-fault judge and the report's table."""

    ranks: tuple[int, ...] = ()  # the ranks named (empty: none)
    how: str = ""  # compare.MAJORITY | PAIR | NO_MAJORITY, "bucket", or LINK (a slow pair)
    tensor: str = ""  # where it went wrong ("output:fc1", "grad:fc1.weight", "bucket:0", "link:1-2")
    repeats: dict[int, tuple[int, ...]] = field(default_factory=dict)  # per named rank: repeats it differed in
    total: int = 0  # repeats run
    persistent: bool = False
    ratio: float | None = None  # a slow link: its best bandwidth over the other such pairs' median

    def to_json(self) -> dict[str, Any]:
        return {"ranks": list(self.ranks), "how": self.how, "tensor": self.tensor,
                "repeats": {str(k): list(v) for k, v in self.repeats.items()}, "total": self.total,
                "persistent": self.persistent, "ratio": self.ratio}


def _where(results: list[dict[str, Any]], rank: int) -> str:
    r = results[rank]
    return f"rank {rank} ({r.get('hostname', '?')}, {r.get('device', '?')})"


def _stats(located: dict[str, Any], rank: int) -> str:
    s = (located.get("stats") or {}).get(str(rank))
    if not s or s.get("elements") is None:
        return ""
    return (f", {s['elements']} of {s['of']} elements differ, largest difference {s['max_abs_diff']:.3g}"
            f" against rank {located['reference']}")


def table(results: list[dict[str, Any]], diagnosis: NodeDiagnosis, speed: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per rank: host, device, digest agreement, step time against the others' median,
    its slowest link, software, whether it is named."""
    rows = []
    per_rank = speed.get("per_rank_s") or {}
    for rank, r in enumerate(results):
        fp = r.get("fingerprint") or {}
        differed = diagnosis.repeats.get(rank, ())
        others = [s for k, s in per_rank.items() if k != rank]
        ratio = per_rank[rank] / statistics.median(others) if rank in per_rank and others else None
        links = [e["median_gbps"] for e in speed.get("links") or [] if rank in e["pair"]]
        rows.append({"rank": rank, "host": r.get("hostname"), "device": r.get("device"),
                     "device_name": fp.get("device_name"),
                     "digests_agree": f"{diagnosis.total - len(differed)}/{diagnosis.total}",
                     "throughput": None if ratio is None else f"x{ratio:.2f} the others' step time",
                     "link_gbps": round(min(links), 3) if links else None,
                     "software": f"torch {fp.get('torch')}, cuda {fp.get('cuda')}, threads {fp.get('threads')}",
                     "named": rank in diagnosis.ranks or any(s["rank"] == rank for s in speed.get("slow") or [])})
    return rows


def _diagnose(results: list[dict[str, Any]]) -> tuple[NodeDiagnosis, dict[str, Any] | None]:
    repeats = results[0]["repeats"]
    per_rank: dict[int, list[int]] = {}
    first: dict[str, Any] | None = None
    for i, rep in enumerate(repeats):
        located = rep.get("located")
        if not located:
            continue
        first = first or located
        for rank in located["ranks"]:
            per_rank.setdefault(rank, []).append(i)
    if first is None:
        return NodeDiagnosis(total=len(repeats)), None
    ranks = tuple(sorted(per_rank))
    persistent = all(len(v) == len(repeats) for v in per_rank.values())
    return NodeDiagnosis(ranks, first["how"], first["tensor"], {k: tuple(v) for k, v in per_rank.items()},
                         len(repeats), persistent), first


def _naming(results: list[dict[str, Any]], d: NodeDiagnosis, located: dict[str, Any]) -> str:
    n = len(results)
    if d.how == MAJORITY:
        parts = []
        for rank in d.ranks:
            when = _when(d.repeats[rank], d.total)
            tensor = (located.get("first") or {}).get(str(rank), d.tensor)
            parts.append(f"{_where(results, rank)} computed differently from the majority of {n} ranks {when}: "
                         f"first at {tensor}{_stats(located, rank)}")
        return "; ".join(parts)
    named = " and ".join(str(r) for r in d.ranks)
    differed = sorted({i for v in d.repeats.values() for i in v})
    when = ("every repeat" if len(differed) == d.total else
            f"{len(differed)} of {d.total} repeats ({', '.join(map(str, differed))})")
    stats = "".join(_stats(located, r) for r in d.ranks if r != located.get("reference"))
    unstable = [r for r in range(n) if len({tuple(rep["digests"]) for rep in results[r]["repeats"]}) > 1]
    own = f"; rank(s) {unstable} also changed their own results between repeats" if unstable else ""
    separate = ("a third rank (--world-size 3 or more) or a rerun of each on another device would say which"
                if d.how == PAIR else "no digest was held by more than half the ranks; a rerun on other devices "
                                      "would say which are wrong")
    return (f"ranks {named} disagree bitwise in {when}, first at {d.tensor}{stats}{own}; nothing here says "
            f"which one is wrong: {separate}")


def judge(results: list[dict[str, Any]]) -> Outcome:
    """The node-health outcome (module docstring) from every rank's :func:`rank.node_rank` data."""
    n = len(results)
    mismatch = mismatches([r["fingerprint"] for r in results])
    diagnosis, located = _diagnose(results)
    own_devices = all(str(r.get("device", "")).startswith("cuda") for r in results)
    speed = judge_speed({rank: r.get("timing") or [] for rank, r in enumerate(results)},
                        [link for r in results for link in r.get("links") or []],
                        threshold=SLOW_RATIO if own_devices else SHARED_SLOW_RATIO,
                        link_factor=LINK_FACTOR if own_devices else SHARED_LINK_FACTOR,
                        hosts={rank: str(r.get("hostname")) for rank, r in enumerate(results)})
    metrics: dict[str, Any] = {NODE_HEALTH: table(results, diagnosis, speed), "diagnosis": diagnosis.to_json(),
                               "software_mismatches": mismatch, "speed": speed}
    evidence: dict[str, Any] = {"located": [rep.get("located") for rep in results[0]["repeats"]],
                                "buckets_located": [rep.get("buckets") for rep in results[0]["repeats"]],
                                "buckets": results[0].get("buckets"), "fingerprint": results[0]["fingerprint"]}
    software = f"software differs across ranks: {describe(mismatch)}" if mismatch else ""
    refused = next((r["not_deterministic"] for r in results if r.get("not_deterministic")), None)
    if refused:
        return Outcome.inconclusive(f"bitwise agreement cannot hold here: {refused}"
                                    + (f"; {software}" if software else ""), metrics=metrics, evidence=evidence)
    if located is not None and located["how"] == STRUCTURE:
        return Outcome.inconclusive(f"the ranks did not run the same work (they part at {located['tensor']}): "
                                    f"a model or input that depends on the rank, not a node fault",
                                    metrics=metrics, evidence=evidence)
    reads = next((r["reads_rank"] for r in results if r.get("reads_rank")), None)
    if located is not None and reads:
        return Outcome.inconclusive(
            f"the target's forward reads its rank (torch.distributed.get_rank() at {', '.join(reads)}): every "
            f"rank runs other work on the same input by design (they part at {located['tensor']}), so their "
            f"disagreement is not a node fault", metrics=metrics, evidence={**evidence, "reads_rank": reads},
            recommendation="For the node's verdict run `ddp-conformance run --checks node-health` (the built-in "
                           "models), or give node-health a target whose forward does the same work on every rank.")
    if located is not None and mismatch:
        return Outcome.inconclusive(f"{software}: that explains the bitwise disagreement at {located['tensor']} "
                                    f"(ranks {list(diagnosis.ranks)}) without any fault; align them and rerun",
                                    metrics=metrics, evidence=evidence,
                                    recommendation="Run every rank with the same software and settings.")
    own = [len({tuple(rep["digests"]) for rep in r["repeats"]}) > 1 for r in results]
    if located is not None and all(own):
        return Outcome.inconclusive(f"every rank's own results changed from repeat to repeat (first difference "
                                    f"at {located['tensor']}): the work is not deterministic here, so ranks "
                                    f"cannot be compared bitwise", metrics=metrics, evidence=evidence)
    mixing = sorted({name for r in results for name in r.get("forward_collectives") or ()})
    if located is not None and mixing and diagnosis.how != MAJORITY:
        return Outcome.inconclusive(f"ranks {list(diagnosis.ranks)} disagree bitwise (first at {located['tensor']}), "
                                    f"and the target's forward or loss calls {', '.join(mixing)}: its results mix "
                                    f"the ranks' data and may depend on the rank (e.g. a gathered-features loss "
                                    f"with labels offset by rank), so they need not agree bitwise; not judged a "
                                    f"node fault (with 3 or more ranks, one rank departing from the others is "
                                    f"still named)", metrics=metrics, evidence=evidence)
    if located is not None:
        if diagnosis.how == MAJORITY and len(diagnosis.ranks) == 1:
            metrics[CULPRIT_RANK] = diagnosis.ranks[0]
        drain = (", ".join(_where(results, r) for r in diagnosis.ranks) if diagnosis.how == MAJORITY
                 else f"the set {list(diagnosis.ranks)} (after the rerun that separates them)")
        return Outcome.failed(_naming(results, diagnosis, located), metrics=metrics, evidence=evidence,
                              recommendation=f"Drain {drain} and run {DIAGNOSTIC}.")
    buckets = results[0].get("buckets") or {}
    reduced = _bucket_outcome(results, metrics, evidence)
    if reduced is not None:
        return reduced
    slow = _slow(results, speed, metrics, evidence, own_devices=own_devices)
    if slow is not None:
        return slow
    names = results[0]["repeats"][0]["names"] if results[0]["repeats"] else []
    count = int(buckets.get("count") or 0)
    evidence[VERIFIED] = {"ranks": n, "tensors": len(names), "repeats": diagnosis.total, "buckets": count}
    if n < 2:
        return Outcome.skipped("one rank has no peer to compare its results with; run with --world-size 2 or more",
                               metrics=metrics, evidence=evidence)
    note = f"; note: {software}" if software else ""
    shared = "" if own_devices else " (CPU ranks share the host's cores)"
    if speed["noisy"] and not own_devices:
        # CPU ranks have no device of their own to drain: a rank slow in some repeats only is
        # the shared host's scheduling, which a busy machine shows every run (a rank slow in
        # every repeat by the shared-cores ratio is still named above).
        note += "; " + ", ".join(f"rank {s['rank']} x{s['ratio']:.2f}" for s in speed["noisy"]) + \
            " slower in some repeats only: the shared host's noise, not judged"
    links = speed["links"]
    bandwidth = (f"; {len(links)} ring link(s) {min(e['median_gbps'] for e in links):.2f}-"
                 f"{max(e['median_gbps'] for e in links):.2f} GB/s" if links else "")
    return Outcome.passed(f"node healthy: {n} ranks agree bitwise on {len(names)} tensors (module outputs, loss, "
                          f"gradients) in {diagnosis.total} repeats and on {count} all-reduced buckets; no rank "
                          f"{speed['threshold']:g}x slower than the others{shared}{bandwidth}{note}",
                          metrics=metrics, evidence=evidence)


def _when(seen: tuple[int, ...], total: int) -> str:
    """In every repeat (persistent) or in which of them (transient), for a message."""
    return ("in every repeat (persistent: drain it)" if len(seen) == total else
            f"in {len(seen)} of {total} repeats (repeat {', '.join(map(str, seen))}: transient)")


def _bucket_outcome(results: list[dict[str, Any]], metrics: dict[str, Any],
                    evidence: dict[str, Any]) -> Outcome | None:
    """An all-reduced bucket that differed between ranks, while every rank's local gradients
    agreed (failed: the bucket, its parameters, the rank(s), in which repeats); None when every
    repeat's buckets agreed."""
    per_repeat = [rep.get("buckets") for rep in results[0]["repeats"]]
    wrong = [(i, b) for i, b in enumerate(per_repeat) if b]
    if not wrong:
        return None
    first = wrong[0][1]
    per_rank: dict[int, tuple[int, ...]] = {}
    for i, located in wrong:
        for rank in located["ranks"]:
            per_rank[rank] = (*per_rank.get(rank, ()), i)
    ranks = tuple(sorted(per_rank))
    total = len(per_repeat)
    persistent = all(len(v) == total for v in per_rank.values())
    index = int(str(first["tensor"]).partition(":")[2] or 0)
    parameters = (results[0].get("buckets") or {}).get("parameters") or {}
    params = parameters.get(index) or parameters.get(str(index), [])
    metrics["diagnosis"] = NodeDiagnosis(ranks, "bucket", first["tensor"], per_rank, total, persistent).to_json()
    alone = first["how"] == MAJORITY and len(ranks) == 1
    who = f"rank {ranks[0]}" if alone else f"ranks {list(ranks)} (a set: {first['how']})"
    if alone:
        metrics[CULPRIT_RANK] = ranks[0]
    when = _when(per_rank[ranks[0]], total) if alone else _when(tuple(sorted({i for i, _ in wrong})), total)
    return Outcome.failed(f"all-reduced bucket {index} (parameters {', '.join(params[:4])}"
                          f"{'…' if len(params) > 4 else ''}) differs on {who} after the all-reduce {when}, while "
                          f"every rank's local gradients agreed: corruption on the wire or in the collective, "
                          f"not in compute{_stats(first, ranks[0])}", metrics=metrics, evidence=evidence,
                          recommendation=f"Drain the node of {who} and test its interconnect (NCCL tests, "
                                         f"the NIC's and GPU's error counters) and run {DIAGNOSTIC}.")


def _slow(results: list[dict[str, Any]], speed: dict[str, Any], metrics: dict[str, Any],
          evidence: dict[str, Any], *, own_devices: bool) -> Outcome | None:
    """A link that corrupts, a slow rank, a slow link (failed), or a slowness the host's noise
    cannot separate from a device's (inconclusive); None when the node is fast everywhere, or
    its only slowness is CPU ranks' in some repeats (said in the pass: ``_noise_note``)."""
    if speed["wrong_links"]:
        pairs = ", ".join(f"ranks {e['pair']} ({e['wrong']} wrong)" for e in speed["wrong_links"])
        return Outcome.failed(f"all-reduce results wrong on the link between {pairs}: corruption on that link",
                              metrics=metrics, evidence=evidence,
                              recommendation=f"Drain the nodes of those ranks and test their interconnect; run {DIAGNOSTIC}.")
    if speed["slow"]:
        metrics[CULPRIT_RANK] = speed["slow"][0]["rank"]
        named = "; ".join(f"{_where(results, s['rank'])} runs the same work x{s['ratio']:.2f} slower than the median "
                          f"of the others, in every repeat (noise {s['noise_s'] * 1e3:.1f} ms)" for s in speed["slow"])
        return Outcome.failed(named, metrics=metrics, evidence=evidence,
                              recommendation="Check that node for clock throttling (nvidia-smi -q -d "
                                             "CLOCK,PERFORMANCE), noisy neighbours and its PCIe link; drain it "
                                             "if it persists.")
    if speed["slow_links"]:
        slowest = min(speed["slow_links"], key=lambda e: e["ratio"])
        a, b = slowest["pair"]
        metrics["diagnosis"] = NodeDiagnosis((a, b), LINK, f"link:{a}-{b}", ratio=slowest["ratio"]).to_json()
        named = "; ".join(f"the link between ranks {e['pair']} ({e['kind']}) reaches {e['best_gbps']:.2f} GB/s at "
                          f"best, x{e['ratio']:.2f} the other such pairs' median" for e in speed["slow_links"])
        return Outcome.failed(named, metrics=metrics, evidence=evidence,
                              recommendation="Check that pair's link (NCCL tests between the two, the NIC's "
                                             "error counters, link width/speed).")
    if speed["noisy"] and own_devices:
        named = "; ".join(f"rank {s['rank']} x{s['ratio']:.2f}" for s in speed["noisy"])
        return Outcome.inconclusive(f"slower ranks ({named}) but not in every repeat: the host's noise cannot "
                                    f"be told from the rank; compute agreed bitwise", metrics=metrics,
                                    evidence=evidence, recommendation="Re-run node-health on an idle node.")
    return None
