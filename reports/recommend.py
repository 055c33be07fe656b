"""Recommendations: each failed, inconclusive or warning check mapped to concrete advice.

The advice is the production checklist of docs/ddp-background.md, specialised with what the check
measured (the best bucket size it found, the cost of ``find_unused_parameters`` it timed, the
culprit rank it named). A check that knows better sets its record's ``recommendation``; that
always wins. Otherwise the rule for the check id supplies one, refined by the metrics and
evidence named in :mod:`reports.keys` — keys that the producing checks import, so that no rule
waits for evidence that nothing emits.

A *warning* is a passed check that still has something to say: a non-empty
:data:`reports.keys.WARNINGS` list in its evidence (e.g. BatchNorm statistics kept per rank).
A failed or inconclusive check always gets advice (the refined one, else its rule's generic
text); a passed one with warnings gets only refined advice that matches its evidence — the
generic text of a failure would be wrong advice for a check that passed.

Every recommendation also says whether it was tried (:func:`verification`): a check that
re-ran the failing scenario with the recommended change lists the outcome under
:data:`reports.keys.REMEDIES` ("verified fix", "did not fix"); advice nobody re-ran is
"suggested, not verified".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, is_dataclass
from typing import Any

from ._format import number
from .keys import (
    BATCHNORM_PER_RANK,
    BEST_BUCKET_CAP_MB,
    CLIFF_WORLD_SIZE,
    CONFIGURED_BUCKET_CAP_MB,
    CULPRIT_RANK,
    FIND_UNUSED_TAX,
    REMEDIES,
    UNUSED_TABLE,
    WARNINGS,
)

Refine = Callable[[Mapping[str, Any], Mapping[str, Any]], str | None]


@dataclass(frozen=True, slots=True)
class Rule:
    """The advice for one check id: ``refine(metrics, evidence)`` when the evidence says more,
    else ``generic`` (failed and inconclusive records only)."""

    generic: str
    refine: Refine | None = None

    def advise(self, metrics: Mapping[str, Any], evidence: Mapping[str, Any], *, failing: bool) -> str | None:
        specific = self.refine(metrics, evidence) if self.refine is not None else None
        return specific or (self.generic if failing else None)


def as_dict(record: Any) -> dict[str, Any]:
    """A record as a plain dict, whether a CheckRecord or already JSON."""
    if isinstance(record, Mapping):
        return dict(record)
    if is_dataclass(record) and not isinstance(record, type):
        return asdict(record)
    return {}


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _names(value: Any, *, limit: int = 5) -> str:
    names = list(value) if isinstance(value, Mapping) else []
    shown = ", ".join(str(v) for v in names[:limit])
    return shown + (f" (+{len(names) - limit} more)" if len(names) > limit else "")


def _rank(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def warnings_of(record: Any) -> list[str]:
    """The record's ``warnings`` evidence (:data:`reports.keys.WARNINGS`) as a list of lines."""
    value = _mapping(as_dict(record).get("evidence")).get(WARNINGS)
    if isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    return [value] if isinstance(value, str) and value else []


def _batchnorm(m: Mapping[str, Any], e: Mapping[str, Any]) -> str | None:
    if e.get(BATCHNORM_PER_RANK) is not True:
        return None
    return ("BatchNorm statistics are per rank: convert with "
            "torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) before wrapping in DDP "
            "(needed when per-GPU batches are small; LayerNorm needs nothing).")


def _unused(m: Mapping[str, Any], e: Mapping[str, Any]) -> str | None:
    names = _names(e.get(UNUSED_TABLE))
    tax = number(m.get(FIND_UNUSED_TAX))
    if not names and tax is None:
        return None
    where = f" (unused: {names})" if names else ""
    cost = f"; measured cost of find_unused_parameters=True here: x{tax:.2f} step time" if tax is not None else ""
    return ("Remove the dynamic branch so every parameter participates every step (e.g. multiply "
            f"the auxiliary head's loss by 0 instead of skipping it){where}, then set "
            f"find_unused_parameters=False{cost}. If the branch must stay, keep "
            "find_unused_parameters=True and accept the cost; never static_graph=True with it.")


def _straggler(m: Mapping[str, Any], e: Mapping[str, Any]) -> str | None:
    culprit = _rank(m.get(CULPRIT_RANK))
    if culprit is None:
        return None
    return (f"Every all-reduce waits for rank {culprit}: check its node for clock throttling "
            "(nvidia-smi -q -d CLOCK,PERFORMANCE), PCIe/NIC link retraining and noisy neighbours, "
            "and evict the node if it persists.")


def _bucket(m: Mapping[str, Any], e: Mapping[str, Any]) -> str | None:
    best = number(m.get(BEST_BUCKET_CAP_MB))
    if best is None:
        return None
    configured = number(m.get(CONFIGURED_BUCKET_CAP_MB))
    now = f" (configured: {configured:g} MB)" if configured is not None else ""
    return (f"Set bucket_cap_mb={best:g}, the fastest value measured{now}; re-measure when the "
            "model, world size or interconnect changes (≈25 within one NVLink node, ≈50 across nodes).")


def _cliff(m: Mapping[str, Any], e: Mapping[str, Any]) -> str | None:
    # allreduce-bandwidth claims a cliff (with a warning) only when its simulator matched the
    # measured step; without one the timings were too noisy to fit or to project from.
    cliff = _rank(m.get(CLIFF_WORLD_SIZE))
    if cliff is None:
        return None
    if m.get("backend") == "gloo":
        # Projected from gloo's link (sockets; on one host its loopback, ranks sharing the CPU
        # cores with it): NCCL's settings change nothing there, and a GPU job's link is another.
        return (f"Over gloo on this link, communication stops hiding behind backward from {cliff} ranks "
                "on: for a gloo job raise gradient accumulation (no_sync) or bucket_cap_mb "
                "(GLOO_SOCKET_IFNAME picks the interface gloo uses); a GPU job runs over another link: "
                "project it on the production GPUs with --backend nccl.")
    return (f"Communication stops hiding behind backward from {cliff} ranks on: raise gradient "
            "accumulation (no_sync) or bucket_cap_mb, and check the fabric (NCCL_IB_HCA / "
            "NCCL_SOCKET_IFNAME pick the fast NIC, NCCL_P2P_DISABLE and NCCL_IB_DISABLE unset, "
            "NCCL_DEBUG=INFO shows the transport chosen).")


RULES: dict[str, Rule] = {
    "gradient-equivalence": Rule(
        "DDP gradients differ from the single-process large-batch step: make the loss a mean "
        "over samples, give every rank a disjoint equal shard (DistributedSampler), keep "
        "state out of globals, and wrap the model in DDP after moving it to its device.", _batchnorm),
    "no-sync-equivalence": Rule(
        "Wrap all but the last microbatch of each accumulation window in model.no_sync(), "
        "divide the loss by the number of microbatches K, and step the optimizer once per "
        "window: one all-reduce per K microbatches, same gradient as one large batch.", _batchnorm),
    "rank-consistency": Rule(
        "Parameters differ across ranks: seed model init identically (DDP broadcasts rank 0's "
        "weights at construction, so do not modify parameters after wrapping), and use "
        "per-rank seeds for dropout/augmentation only."),
    "sampler-coverage": Rule(
        "Use DistributedSampler with the same seed on every rank and call set_epoch(epoch) "
        "every epoch; with drop_last=False some samples repeat (padding) — avoid that for evaluation."),
    "shared-weights": Rule(
        "Tie shared weights before wrapping in DDP (one Parameter object used twice, not a "
        "copy) and never re-tie after wrapping; with activation checkpointing on tied "
        "weights, checkpoint with use_reentrant=False (static_graph=True also works, but not with "
        "no_sync accumulation on torch 2.13) instead of find_unused_parameters=True."),
    "unused-parameters": Rule(
        "Remove the dynamic branch so every parameter participates every step, then set "
        "find_unused_parameters=False; if the branch must stay, keep find_unused_parameters=True "
        "and accept its cost; never static_graph=True with it.", _unused),
    "straggler": Rule(
        "Every all-reduce waits for the slowest rank: check the nodes for clock throttling "
        "(nvidia-smi -q -d CLOCK,PERFORMANCE), PCIe/NIC link retraining and noisy neighbours, "
        "and evict a node that stays slow.", _straggler),
    "bucket-config": Rule(
        "Sweep bucket_cap_mb (≈25 within one NVLink node, ≈50 across nodes on 200/400 Gb "
        "RoCE/IB) and keep the fastest; also set gradient_as_bucket_view=True.", _bucket),
    "hang-detection": Rule(
        "Make hangs fail fast and diagnosable: pass timeout= to init_process_group, keep "
        "TORCH_NCCL_ASYNC_ERROR_HANDLING=3, enable the flight recorder "
        "(TORCH_NCCL_TRACE_BUFFER_SIZE>0, TORCH_NCCL_DUMP_ON_TIMEOUT=1), and make sure every "
        "rank reaches every collective (no rank-dependent branches around them)."),
    "allreduce-bandwidth": Rule(
        "The all-reduce timings were too noisy to fit or to project from: re-run the check "
        "alone on an idle machine (--checks allreduce-bandwidth, no other jobs on its cores "
        "or GPUs).", _cliff),
    "scaling-cliff": Rule(
        "The shaped-link sweep could not be judged (all-reduce timings too noisy to fit, or no "
        "cliff within the sweep): re-run the check alone on an idle machine (--checks "
        "scaling-cliff, no other jobs on its cores)."),
    "eval-equivalence": Rule(
        "Evaluate the whole eval set once on every rank: shard without DistributedSampler's "
        "padding (or drop the repeats before counting), all-reduce sums and counts and divide "
        "once, under model.eval() and torch.no_grad(), with no all_gather of tensors whose "
        "length differs by rank; every rank runs evaluate (and the same collectives)."),
}

NEXT_STEP = ("The check could not decide: read its evidence, fix the harness error, and re-run it "
             "alone with --checks.")


def recommend(record: Any) -> str | None:
    """Advice for one record (CheckRecord or dict), or ``None`` when there is nothing to say.

    The record's own ``recommendation`` wins. Failed and inconclusive checks get their rule's
    advice (refined by evidence where it can be); passed ones with warnings get refined advice
    only; other passed and skipped checks get none. An inconclusive check without a rule
    still gets a next step.
    """
    data = as_dict(record)
    own = data.get("recommendation")
    if isinstance(own, str) and own.strip():
        return own.strip()
    status = data.get("status")
    failing = status in ("failed", "inconclusive")
    if not failing and not warnings_of(data):
        return None
    rule = RULES.get(str(data.get("id")))
    # Rules read through number()/_rank()/_names()/_mapping(), which turn malformed values
    # into "absent": a record from a newer or broken writer never breaks a report.
    advice = rule.advise(_mapping(data.get("metrics")), _mapping(data.get("evidence")), failing=failing) \
        if rule is not None else None
    if advice is None and status == "inconclusive":
        return NEXT_STEP
    return advice


#: What a re-run with the recommended change showed (conformance/harness/remedies.py writes
#: them): it passed the failed rule, it still failed it, or no re-run backs the advice.
VERIFIED, DID_NOT_FIX, NOT_VERIFIED = "verified fix", "did not fix", "suggested, not verified"
_CHANGE, _STATUS = "change", "status"  # the fields of one remedy entry


def remedies_of(record: Any) -> list[Mapping[str, Any]]:
    """The record's re-run remedies (:data:`reports.keys.REMEDIES`), malformed entries dropped."""
    value = _mapping(as_dict(record).get("evidence")).get(REMEDIES)
    if not isinstance(value, (list, tuple)):
        return []
    # The entry's own fields (conformance/harness/remedies.py, Remedy.to_json), not evidence keys.
    return [r for r in value if isinstance(r, Mapping) and isinstance(r.get(_CHANGE), str)
            and isinstance(r.get(_STATUS), str)]


def verification(record: Any) -> str | None:
    """One line saying whether the record's recommendation was verified by a re-run.

    ``"verified fix: static_graph=True; did not fix: bucket_cap_mb=5"`` when the check re-ran
    its failing scenario with the changes; ``"suggested, not verified"`` for advice that no
    re-run backs; None when there is no recommendation at all.
    """
    tried = remedies_of(record)
    if tried:
        return "; ".join(f"{r[_STATUS]}: {r[_CHANGE]}" for r in tried)
    return NOT_VERIFIED if recommend(record) else None
