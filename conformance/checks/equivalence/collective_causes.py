"""Causes in the collectives the step itself calls: named from what was recorded and measured.

The record holds every collective the first step called in its forward, its loss and the
backward of an ``autograd.Function`` (``harness.observe.StepCollectives``), the loss at the
initial weights on every rank and in the reference (``start_loss``), and each parameter's
gradient factor against the reference (``hypotheses.factors_by_name``). A cause is named when
they support it, each with one fix (:class:`Named`):

- the ranks' mean loss equals the reference's and the gradients differ: the bug is in the
  backward —
  - a reduction through ``torch.distributed`` (not differentiable) on a tensor that requires
    grad: only this rank's share of the gradient flows back (every factor exactly 1/N when the
    whole loss goes through it);
  - a gather through ``torch.distributed`` of a tensor that requires grad: the gathered copies
    carry no gradient; with this rank's own slot re-inserted, each rank's features receive the
    gradient of its own loss only (the towers at 1/N where every rank computes the whole
    batch's loss, the parameters used in the loss alone at 1);
  - a gather inside an ``autograd.Function`` whose backward issued no collective: the local
    slice of the gradient is returned without summing it over the ranks (factors between 1/N
    and 1);
- the losses differ: the bug is in the forward —
  - a ``cross_entropy`` on a rank > 0 whose targets are the diagonal of its local block
    (``arange(rows)``) while its logits' columns are the N ranks' gathered rows: labels not
    offset by rank;
  - a ``cross_entropy`` that scores each rank's rows against fewer candidates than the
    reference's: negatives taken from this rank's batch only (not gathered);
  - the reference's loss is a weighted mean of the ranks' losses (within their range) but not
    their plain mean: a normaliser (a count, a batch statistic) taken per rank.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...harness.observe.step_collectives import BACKWARD, FORWARD, FUNCTIONAL, PLAIN, StepCollective
from .comparison import Equivalence
from .hypotheses import SPREAD
from .start_loss import StartLoss

#: |mean of the ranks' losses - the reference's| / |the reference's| still counted as equal:
#: fp32 summation order moves a loss by ~1e-7 relative; a per-rank count or a misplaced label
#: moves it by percents (1.6e-2 and 0.49 on examples/train_contrastive.py's variants).
LOSS_GAP = 1e-4
_REDUCTIONS = ("all_reduce", "reduce")
_GATHERS = ("all_gather", "all_gather_into_tensor", "all_gather_single")


@dataclass(frozen=True, slots=True)
class Named:
    """A cause the record supports, and the one change that fixes it."""

    cause: str
    fix: str


def _near(value: float, target: float) -> bool:
    return abs(value - target) <= SPREAD * abs(target)


def _start(record: Mapping[str, Any]) -> StartLoss | None:
    started: StartLoss | None = record.get("start_loss")
    return started


def _losses(eq: Equivalence) -> tuple[list[float], float] | None:
    ranks, ref = [_start(r) for r in eq.ranks], _start(eq.reference)
    if ref is None or any(v is None for v in ranks):
        return None
    return [v["value"] for v in ranks if v is not None], ref["value"]


def _factors(eq: Equivalence) -> str:
    s = eq.judged_scale
    n = eq.world_size
    if not s.parameters:
        return "no comparable gradient"
    if s.uniform is not None and _near(s.uniform, 1 / n):
        return f"every gradient is exactly 1/{n} of the single-process one"
    return f"per-parameter gradient factors {s.low:.3g}..{s.high:.3g}"


def _non_differentiable_reduction(eq: Equivalence, call: StepCollective) -> Named:
    n = eq.world_size
    return Named(
        f"the {call.describe()} is not differentiable: autograd does not see it, so the gradient "
        f"through it is this rank's share only — the other ranks' losses depend on this rank's "
        f"contribution too ({_factors(eq)}; exactly 1/{n} where the whole loss goes through it)",
        f"use `torch.distributed.nn.functional.{call.op}` (its backward {call.op}s the gradient "
        f"over the ranks) in place of `torch.distributed.{call.op}` in {call.where}")


def _gather_without_gradient(eq: Equivalence, call: StepCollective) -> Named:
    n = eq.world_size
    if call.own_slot_replaced:
        at_one = sorted(name for name, (lo, hi) in eq.factors.items() if _near(lo, 1) and _near(hi, 1))
        at_share = sorted(name for name, (lo, hi) in eq.factors.items() if _near(lo, 1 / n) and _near(hi, 1 / n))
        signature = (f": {len(at_share)} parameters at exactly 1/{n} (the ones behind the gathered "
                     f"features), {', '.join(at_one)} at 1 (used in the loss alone)"
                     if at_share and at_one else f" ({_factors(eq)})")
        what = (f"the {call.describe()} is not differentiable: only this rank's own slot, re-inserted "
                f"after the gather, carries a gradient, so each rank's features receive the gradient "
                f"of this rank's loss only, not of the losses of the ranks that used them as negatives"
                f"{signature}")
    else:
        what = (f"the {call.describe()} is not differentiable and this rank's own slot is not "
                f"re-inserted: the features of every rank enter the loss without a gradient, so "
                f"the parameters behind them receive only the gradient through the local branch "
                f"({_factors(eq)})")
    return Named(what, f"gather with a gradient: `torch.distributed.nn.functional.all_gather` "
                       f"(open_clip: gather_with_grad=True) in place of `torch.distributed.{call.op}` "
                       f"in {call.where}")


def _gather_layer(eq: Equivalence, call: StepCollective) -> Named | None:
    n, s = eq.world_size, eq.judged_scale
    if not _share_lost(eq, lowest=1 / n):
        return None  # not the signature of a gradient that misses the other ranks' share
    return Named(
        f"{call.function}'s backward issues no collective (its forward {call.op}s {list(call.shape)} "
        f"in {call.where}): it returns this rank's slice of the gradient without summing it over "
        f"the ranks, so the gradient the other ranks' losses send to this rank's features is lost "
        f"(per-parameter gradient factors between 1/{n} and 1: {s.low:.3g}..{s.high:.3g})",
        f"in {call.function}.backward, all-reduce the gradient (`dist.all_reduce(grad)`, a sum) "
        f"before returning this rank's slice, or use `torch.distributed.nn.functional.all_gather`")


def _share_lost(eq: Equivalence, *, lowest: float) -> bool:
    """Every gradient factor between ``lowest`` and 1: each parameter gets part of its gradient
    or all of it, never more (a loss scaled up, a gradient counted twice is another bug)."""
    s = eq.judged_scale
    floor = lowest * (1 - SPREAD) if lowest else -SPREAD
    return bool(s.parameters) and floor <= s.low and s.high <= 1 + SPREAD


def _backward_causes(eq: Equivalence, calls: list[StepCollective]) -> list[Named]:
    forward = [c for c in calls if c.phase == FORWARD]
    with_backward = {c.function for c in calls if c.phase == BACKWARD}
    n = eq.world_size
    for call in forward:
        # What flows back through a reduction autograd does not see is this rank's share (1/N
        # of the gradient through it); through a gathered copy, nothing.
        if (call.api == PLAIN and call.requires_grad and call.op in _REDUCTIONS and call.grad_enabled
                and _share_lost(eq, lowest=1 / n)):
            return [_non_differentiable_reduction(eq, call)]
        if call.api == PLAIN and call.requires_grad and call.op in _GATHERS and _share_lost(eq, lowest=0.0):
            return [_gather_without_gradient(eq, call)]
    for call in forward:
        if (call.differentiable and call.api != FUNCTIONAL and call.op in _GATHERS
                and call.function not in with_backward):
            named = _gather_layer(eq, call)
            if named is not None:
                return [named]
    return []


def _labels_not_offset(eq: Equivalence) -> Named | None:
    n = eq.world_size
    ref_calls = (_start(eq.reference) or StartLoss(value=0.0, cross_entropy=[]))["cross_entropy"]
    if not any(c["offset"] == 0 and c["rows"] == c["columns"] for c in ref_calls):
        return None  # the single-process loss has no diagonal of positives
    for rank, record in enumerate(eq.ranks[1:], start=1):
        for c in (_start(record) or StartLoss(value=0.0, cross_entropy=[]))["cross_entropy"]:
            rows = c["rows"]
            if c["offset"] == 0 and c["columns"] == n * rows:
                return Named(
                    f"labels are not offset by rank: on rank {rank} the loss's cross_entropy scores "
                    f"{rows} rows against {c['columns']} gathered columns with targets 0..{rows - 1} "
                    f"(the positives of rank 0's rows), but rank {rank}'s own positives are columns "
                    f"{rank * rows}..{(rank + 1) * rows - 1} of the gathered matrix; the single-process "
                    f"step's targets are the diagonal 0..{c['columns'] - 1}",
                    f"offset the labels by this rank's rows: `labels = torch.arange(b) + rank * b` "
                    f"(b = the rank's batch)")
    return None


def _negatives_not_gathered(eq: Equivalence) -> Named | None:
    """A cross_entropy whose rows are this rank's share of the reference's but whose columns
    (the candidates each row is scored against) are fewer: the negatives are this rank's own."""
    n = eq.world_size
    if any(c.op in _GATHERS for c in eq.ranks[0].get("step_collectives") or []):
        return None  # something is gathered: not this
    ref_calls = (_start(eq.reference) or StartLoss(value=0.0, cross_entropy=[]))["cross_entropy"]
    mine = (_start(eq.ranks[0]) or StartLoss(value=0.0, cross_entropy=[]))["cross_entropy"]
    for ours, theirs in zip(mine, ref_calls):
        if ours["rows"] * n == theirs["rows"] and ours["columns"] < theirs["columns"]:
            return Named(
                f"the contrastive loss takes its negatives from this rank's batch only: its "
                f"cross_entropy scores each of rank 0's {ours['rows']} rows against {ours['columns']} "
                f"candidates, the single-process step's {theirs['rows']} rows against "
                f"{theirs['columns']} (no gather in the step); at the same weights the losses differ",
                "gather the features of every rank with a gradient (`torch.distributed.nn.functional."
                "all_gather`), score each rank's rows against all of them, and offset the labels by "
                "rank (`labels = torch.arange(b) + rank * b`)")
    return None


def _counted_per_rank(eq: Equivalence, losses: list[float], ref: float) -> Named | None:
    """The reference's loss is a weighted mean of the ranks' losses (within their range) but
    not their plain mean: the signature of a normaliser taken over each rank's samples."""
    low, high = min(losses), max(losses)
    slack = LOSS_GAP * abs(ref)
    if not (low - slack <= ref <= high + slack) or high - low <= slack:
        return None  # not a weighted mean of the ranks' losses
    shares = ""
    if len(losses) == 2:
        w0 = (ref - losses[1]) / (losses[0] - losses[1])
        shares = f"; the single-process loss is their mean weighted {w0:.3g} : {1 - w0:.3g}"
    counts = [[c.values_in for c in r.get("step_collectives") or []
               if c.op in _REDUCTIONS and c.values_in and len(c.values_in) == 1] for r in eq.ranks]
    seen = (f"; scalars all-reduced in the step, per rank: {counts}" if any(counts) else
            "; no scalar was all-reduced in the step")
    per_rank = ", ".join(f"rank {r} {v:.6g}" for r, v in enumerate(losses))
    return Named(
        f"the loss is normalised per rank: at the same weights the ranks' losses ({per_rank}; mean "
        f"{sum(losses) / len(losses):.6g}) do not average to the single-process loss {ref:.6g}{shares} "
        f"— a normaliser (a count of targets, boxes, tokens or counted pairs, or a batch statistic "
        f"such as a sum) is taken over each rank's samples where the large-batch step takes it "
        f"over the whole batch, so DDP's average weighs the ranks unequally{seen}",
        "all-reduce the normaliser before dividing by it (a count: `dist.all_reduce(count)`, then "
        "`loss = total * world_size / count`, since DDP averages the ranks' gradients)")


def collective_causes(eq: Equivalence) -> list[Named]:
    """The causes the record supports (module docstring), each with its fix; [] when none."""
    calls: list[StepCollective] = list(eq.ranks[0].get("step_collectives") or []) if eq.ranks else []
    losses = _losses(eq)
    if losses is not None:
        values, ref = losses
        if abs(sum(values) / len(values) - ref) > LOSS_GAP * abs(ref):
            forward = (_labels_not_offset(eq) or _negatives_not_gathered(eq)
                       or _counted_per_rank(eq, values, ref))
            return [forward] if forward is not None else []
    return _backward_causes(eq, calls) if calls else []
