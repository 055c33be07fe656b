"""The outcome of eval-equivalence from the N ranks' records and the 1-rank reference's."""

from __future__ import annotations

from typing import Any

from ddp_conformance.reports.keys import CULPRIT_RANK, VERIFIED

from ...harness.outcome import Outcome
from .judge import REDUCER_ERROR, Cause, Comparison, Coverage, Hygiene, causes, compare, coverage, hygiene, padding_text
from .records import EvalRank

NO_CAUSE = "no known cause matched"
REC_LOCAL_SHARDS = ("read a sharded parameter whole in evaluate: p.full_tensor() (a collective: on every rank, "
                    "in the same order), or a DTensor operation whose result is reduced over the shards "
                    "(torch.linalg.vector_norm(p) on the DTensor), never p.to_local()")
REC_PADDING = ("count every sample once: shard without padding (indices rank, rank+N, ...), or drop the "
               "padded repeats before counting (DistributedSampler pads to a multiple of the world size, "
               "pytorch/pytorch#25162)")
REC_REDUCE = ("all-reduce the sums and the counts (SUM) and divide once at the end; never average "
              "per-rank means, never log one rank's own value")
REC_FIXED_SET = ("evaluate one fixed set whatever the world size: shard it across the ranks (a "
                 "DistributedSampler over the eval dataset, or total_batches // world_size batches per "
                 "rank) and reduce sums and counts, so N ranks evaluate what one rank does")
REC_TRAIN = "call model.eval() (and torch.no_grad()) before evaluating, model.train() after"
REC_EVERY_RANK = ("run evaluate on every rank (each on its shard, then reduce), or on rank 0 only through "
                  "model.module with no collective inside, while the others wait in a barrier")
REC_DEADLOCK = ("give every blocking receive its send on the peer (or exchange with all_reduce / all_gather, which "
                "every rank calls alike), and make every rank call the same collectives in the same order")
REC_GATHER = ("all_gather needs the same shape on every rank: all-reduce sums and counts instead, or "
              "gather the sizes first, pad to the largest and trim after, or use all_gather_object")


def _numbers(values: dict[int, float | None]) -> str:
    return ", ".join(f"rank {r} {'missing' if v is None else f'{v:.6g}'}" for r, v in values.items())


def _metric_problem(comp: Comparison, world_size: int) -> str:
    if comp.missing:
        return f"metric {comp.metric!r} missing on {', '.join(comp.missing)}"
    if not comp.ranks_agree:
        return f"metric {comp.metric!r} differs across ranks ({_numbers(comp.per_rank)})"
    return (f"metric {comp.metric!r} on {world_size} ranks is {comp.first:.6g}, on 1 rank {comp.reference:.6g} "
            f"(|Δ| {comp.max_diff:.3g} > tolerance {comp.tolerance:.2g})")


def _evidence(comps: list[Comparison], cov: Coverage, hyg: Hygiene, ranks: list[EvalRank]) -> dict[str, Any]:
    return {"metrics": {c.metric: c.as_dict() for c in comps}, "samples": cov.as_dict(),
            "hygiene": hyg.as_dict(),
            "collectives": {str(r.rank): [c.op + (f"({c.reduce_op})" if c.reduce_op else "") for c in
                                          r.collectives.calls[:20]] for r in ranks},
            "forwards_per_rank": {str(r.rank): r.forward.calls for r in ranks},
            "evaluate_seconds": {str(r.rank): r.seconds for r in ranks}}


def _hygiene_problems(hyg: Hygiene, *, mode_named: bool) -> tuple[list[str], list[str]]:
    """(problems, recommendations) of what evaluate must leave alone (``mode_named``: a metric's
    cause already names the train mode and the buffers it changed)."""
    problems: list[str] = []
    recs: list[str] = []
    if hyg.buffers_changed and not mode_named:
        rank, names = next(iter(hyg.buffers_changed.items()))
        problems.append(f"evaluate changed buffers on rank {rank}: {', '.join(names[:4])}")
    if hyg.grad_enabled:
        problems.append("the forward ran with autograd on during evaluate ("
                        + ", ".join(f"rank {r} {t}" for r, t in hyg.grad_enabled.items()) + ")")
        recs.append("evaluate under torch.no_grad() (or torch.inference_mode())")
    if hyg.grads_written:
        rank, names = next(iter(hyg.grads_written.items()))
        problems.append(f"evaluate wrote gradients on rank {rank} ({', '.join(names[:3])}): a backward ran")
    if hyg.step_errors:
        rank, error = next(iter(hyg.step_errors.items()))
        text = f"the training step after evaluate raised on rank {rank}: {error}"
        if REDUCER_ERROR in error and hyg.grad_enabled:
            text += (" — cause: evaluate's forward through DDP with autograd on prepared a gradient "
                     "reduction that no backward finished")
        problems.append(text)
    if hyg.train_mode and not hyg.buffers_changed and not mode_named:
        rank, modules = next(iter(hyg.train_mode.items()))
        problems.append(f"modules in train mode during evaluate on rank {rank}: {', '.join(modules[:4])}")
    if hyg.train_mode or hyg.buffers_changed:
        recs.append(REC_TRAIN)
    return problems, recs


def _key_figure(wrong: list[Comparison], world_size: int, found: list[Cause]) -> str:
    """The metric furthest from the 1-rank value (relative), and the cause's name."""
    def rel(c: Comparison) -> float:
        return c.max_diff / max(abs(c.reference or 0.0), 1e-12)

    c = max(wrong, key=rel)
    why = f" ({', '.join(x.name for x in found)})" if found else ""
    if c.missing or not c.ranks_agree or c.first is None or c.reference is None:
        return f"{c.metric} {'missing' if c.missing else 'differs across ranks'}{why}"
    return f"{c.metric} {c.first:.6g} on {world_size} ranks vs {c.reference:.6g} on 1{why}"


def _recommend(names: set[str]) -> list[str]:
    recs = []
    if names & {"padding", "missing"}:
        recs.append(REC_PADDING)
    if "per-rank-set" in names:
        recs.append(REC_FIXED_SET)
    if names & {"mean-of-means", "no-reduction"}:
        recs.append(REC_REDUCE)
    if "train-mode" in names:
        recs.append(REC_TRAIN)
    if "only-some-ranks" in names:
        recs.append(REC_EVERY_RANK)
    if "local-shards" in names:
        recs.append(REC_LOCAL_SHARDS)
    return recs


def _passed(comps: list[Comparison], cov: Coverage, hyg: Hygiene, world_size: int,
            evidence: dict[str, Any]) -> Outcome:
    shards = "+".join(str(n) for n in cov.per_rank.values())
    worst = max((c.max_diff for c in comps), default=0.0)
    message = (f"{len(comps)} metric(s) ({', '.join(c.metric for c in comps[:6])}) on {world_size} ranks equal "
               f"the 1-rank run within tolerance (max |Δ| {worst:.2g}) and on every rank; {cov.seen} samples "
               f"({shards} per rank, by {cov.by}) against {cov.expected} on 1 rank; eval mode, no autograd and "
               f"{hyg.buffers_compared} buffer(s) unchanged on every rank over {hyg.forwards} forwards; a "
               f"training step after evaluate ran")
    if cov.duplicates:
        repeats = sum(n - 1 for n in cov.duplicates.values())
        # The smallest move a counted repeat makes: 10% of the metric's value, once in n + repeats.
        resolved = all(c.tolerance < 0.1 * abs(c.reference or 0.0) / (cov.expected + repeats) for c in comps)
        if not resolved:
            return Outcome.inconclusive(
                f"{padding_text(cov, world_size, verb='forwarded')}, and the metrics agree within a tolerance (max "
                f"|Δ| {worst:.2g}) too wide at {cov.expected} samples to see {repeats} repeat(s): it cannot tell "
                f"repeats counted from repeats removed", metrics={"key_figure": f"{repeats} repeat(s) forwarded"},
                evidence=evidence, recommendation=REC_PADDING)
        message += (f"; note: {padding_text(cov, world_size, verb='forwarded')} — yet the metrics agree, so "
                    f"the repeats are not counted")
    metrics = {"key_figure": f"{len(comps)} metric(s) equal on {world_size} ranks and 1 ({cov.expected} samples)",
               "metrics_compared": len(comps), "samples": cov.expected, "max_abs_diff": worst}
    # What this pass compared, for the verdict's "ready means verified" rule (reports/verdict.py).
    evidence = {**evidence, VERIFIED: {"ranks": world_size, "metrics_compared": len(comps),
                                       "samples_seen": cov.seen}}
    return Outcome.passed(message, metrics=metrics, evidence=evidence)


def deadlocked(ranks: list[EvalRank]) -> Outcome | None:
    """Every rank's evaluate ended waiting for a peer (its own timeout, or the connection a peer
    closed when its timeout came first): no rank raised first, every rank waited for another.
    That is the N-rank evaluation's deadlock, named by each rank's call; None otherwise.

    Judged before the 1-rank reference runs and before its error is read: a 1-rank world has no
    peer to wait for, so there the same evaluate raises at once or returns, and its error
    ("Pair is not connected") would stand in for the N-rank hang."""
    if not ranks or any(r.error is None or not _symptom(r.error) for r in ranks):
        return None
    where = {r.rank: r.error_call or "a call the suite could not place" for r in ranks}
    calls = ", ".join(f"rank {r} in {call}" for r, call in where.items())
    forwards = {str(r.rank): r.forward.calls for r in ranks}
    return Outcome.failed(
        f"evaluate deadlocked on all {len(ranks)} ranks: {calls}; no rank raised first, each waited for "
        f"a peer that never matched its call until the process group's timeout released it "
        f"({ranks[0].error})",
        metrics={"key_figure": f"evaluate deadlocked on {len(ranks)} ranks ({', '.join(sorted(set(where.values())))})",
                 "stuck_ranks": [r.rank for r in ranks]},
        evidence={"rank_errors": {str(r.rank): r.error for r in ranks},
                  "calls": {str(r): call for r, call in where.items()}, "forwards_per_rank": forwards},
        recommendation=REC_DEADLOCK)


def verdict(ranks: list[EvalRank], reference: EvalRank) -> Outcome:
    """Judge the N ranks' records (rank order) against the 1-rank reference's."""
    world_size = len(ranks)
    if (hung := deadlocked(ranks)) is not None:
        return hung
    if reference.error is not None:
        return Outcome.inconclusive(f"evaluate raised in the 1-rank reference world: {reference.error}",
                                    metrics={"key_figure": "no 1-rank reference"})
    if not reference.metrics:
        return Outcome.skipped("evaluate returned no metrics in the 1-rank world: nothing to compare")
    if any(r.params_digest != reference.params_digest for r in ranks):
        return Outcome.inconclusive("the N-rank and the 1-rank runs evaluated different weights (build_model "
                                    "is not deterministic under the suite's seed): nothing comparable")
    if any(r.error is not None for r in ranks):
        return errored(ranks)
    if not reference.forward.calls and not any(r.forward.calls for r in ranks):
        # Metrics that no forward produced (a constant, a value logged earlier) agree on every
        # world size whatever the evaluation would do: equal numbers verified nothing.
        shown = ", ".join(f"{k}={v:g}" if isinstance(v, (int, float)) else f"{k}={v!r}"
                          for k, v in list(reference.metrics.items())[:4])
        return Outcome.skipped(
            f"evaluate returned {shown} without a forward of the model, on {world_size} ranks and on 1: it "
            f"evaluated nothing, so there is nothing to compare", metrics={"key_figure": "evaluate ran no forward"},
            evidence={"forwards_per_rank": {str(r.rank): 0 for r in ranks}, "reference_forwards": 0},
            recommendation="evaluate(model, ctx) must run the model it is given over its eval data and "
                           "return the metrics computed from those forwards")
    cov = coverage(ranks, reference)
    comps = compare(ranks, reference, max(cov.expected, 1))
    hyg = hygiene(ranks)
    evidence = _evidence(comps, cov, hyg, ranks)
    wrong = [c for c in comps if not c.equal]
    found = causes(ranks, wrong[0], cov) if wrong else []
    named = {c.name for c in found}
    problems, recs = _hygiene_problems(hyg, mode_named="train-mode" in named)
    if wrong:
        text = "; ".join(_metric_problem(c, world_size) for c in wrong[:3])
        text += (" — cause: " + "; ".join(c.text for c in found) if found else
                 f" — {NO_CAUSE} (samples {cov.seen} on {world_size} ranks vs {cov.expected}, collectives "
                 f"per rank {[len(r.collectives.calls) for r in ranks]}; see the evidence)")
        problems.insert(0, text)
        evidence["causes"] = [c.name for c in found]
    if not problems:
        return _passed(comps, cov, hyg, world_size, evidence)
    key = _key_figure(wrong, world_size, found) if wrong else problems[0][:80]
    metrics = {"key_figure": key, "metrics_compared": len(comps), "samples": cov.expected,
               "metrics_differing": [c.metric for c in wrong]}
    return Outcome.failed("; ".join(problems), metrics=metrics, evidence=evidence,
                          recommendation="; ".join(dict.fromkeys(_recommend(named) + recs)) or None)


def errored(ranks: list[EvalRank]) -> Outcome:
    """evaluate raised on some rank: an uneven gather, some ranks evaluating alone, or else."""
    errors = {r.rank: r.error for r in ranks if r.error is not None}
    forwards = {r.rank: r.forward.calls for r in ranks}
    evidence: dict[str, Any] = {"rank_errors": {str(k): v for k, v in errors.items()},
                                "forwards_per_rank": {str(k): v for k, v in forwards.items()},
                                "step_errors": {str(r.rank): r.step.error for r in ranks if r.step.error}}
    uneven = next((r.collectives.uneven for r in ranks if r.collectives.uneven is not None), None)
    if uneven is not None:
        shapes = uneven.shapes
        culprits = [r for r, s in shapes.items() if s != shapes[0]]
        sizes = ", ".join(f"rank {r} {list(s)}" for r, s in sorted(shapes.items()))
        evidence["uneven_collective"] = {"op": uneven.op, "call_index": uneven.call_index,
                                         "shapes": {str(r): list(s) for r, s in shapes.items()}}
        return Outcome.failed(
            f"evaluate's {uneven.op} (collective #{uneven.call_index}) of tensors of different shapes: {sizes} "
            f"— culprit rank {', '.join(map(str, culprits))} (shape differs from rank 0's); on gloo the rank "
            f"receiving more bytes than it allocated aborts and the others get garbage rows, NCCL hangs or "
            f"returns garbage, so the suite stopped it before it was issued",
            metrics={"key_figure": f"uneven {uneven.op}: {sizes}", CULPRIT_RANK: culprits[0] if culprits else None},
            evidence=evidence, recommendation=REC_GATHER)
    idle = [r for r, n in forwards.items() if n == 0]
    busy = [r for r, n in forwards.items() if n > 0]
    # The rank whose error is not a peer's symptom (a collective timed out or was reset waiting
    # for the rank that left) is the one that raised first.
    rank, error = next(((r, e) for r, e in errors.items() if not _symptom(e)), next(iter(errors.items())))
    train = sorted({m for r in ranks for m in r.forward.train_mode_modules})
    why = (f" — cause: model in train mode during evaluate ({', '.join(repr(m) for m in train[:4])} in train "
           f"mode at the forward)" if train else "")
    others = "; ".join(f"rank {r}: {e}" for r, e in errors.items() if r != rank)
    also = f" (then {others})" if others else ""
    if idle and busy:
        return Outcome.failed(
            f"only rank(s) {busy} evaluated (forwards per rank: "
            f"{', '.join(f'rank {r} {n}' for r, n in forwards.items())}): rank {rank}'s evaluate raised "
            f"{error} while rank(s) {idle} went on — every rank must run the same collectives (DDP's forward "
            f"broadcasts buffers, a metric's all-reduce), or evaluate the bare module on one rank",
            metrics={"key_figure": f"only rank(s) {busy} evaluated", CULPRIT_RANK: idle[0]},
            evidence=evidence,
            recommendation=REC_EVERY_RANK)
    if train:
        return Outcome.failed(f"evaluate raised on rank {rank}: {error}{why}{also}",
                              metrics={"key_figure": f"evaluate raised on rank {rank} (train mode)",
                                       CULPRIT_RANK: rank}, evidence=evidence, recommendation=REC_TRAIN)
    return Outcome.failed(f"evaluate raised on rank {rank}: {error}{also} — {NO_CAUSE} (forwards per rank: "
                          f"{', '.join(f'rank {r} {n}' for r, n in forwards.items())})",
                          metrics={"key_figure": f"evaluate raised on rank {rank}", CULPRIT_RANK: rank},
                          evidence=evidence)


def _symptom(error: str) -> bool:
    text = error.lower()
    return any(s in text for s in ("timed out", "timeout", "connection closed", "connection reset", "broken pipe"))


def failed_world(results: list[Any], described: dict[int, str]) -> Outcome | None:
    """Some rank died or was stuck while others returned their records (``results``: every
    rank's RankResult; ``described``: rank -> its RankError in words). Returns None when no
    rank returned a record (the world error then speaks for itself)."""
    returned = [r.value for r in results if r.error is None and isinstance(r.value, EvalRank)]
    if not returned:
        return None
    lost = ", ".join(f"rank {r} {text}" for r, text in sorted(described.items()))
    idle = [r.rank for r in returned if r.forward.calls == 0]
    said = "; ".join(f"rank {r.rank} returned from evaluate after {r.forward.calls} forwards"
                     + (f" and its training step raised {r.step.error[:120]}" if r.step.error else "")
                     for r in returned)
    evidence = {"rank_errors": {str(k): v for k, v in described.items()},
                "forwards_per_rank": {str(r.rank): r.forward.calls for r in returned},
                "step_errors": {str(r.rank): r.step.error for r in returned if r.step.error}}
    if idle:
        return Outcome.failed(
            f"only some ranks evaluated: rank(s) {idle} returned from evaluate after 0 forwards and went on "
            f"into the training step, while {lost} ({said}) — every rank must run the same collectives (DDP's "
            f"forward broadcasts buffers, a metric's all-reduce)",
            metrics={"key_figure": f"rank(s) {idle} did not evaluate", CULPRIT_RANK: idle[0]},
            evidence=evidence, recommendation=REC_EVERY_RANK)
    return Outcome.failed(f"evaluate failed: {lost} ({said}) — {NO_CAUSE}",
                          metrics={"key_figure": "a rank died in evaluate"}, evidence=evidence)
