"""Check ``eval-equivalence``: the target's evaluation on N ranks reports what it reports on one.

    ddp-conformance run --target examples/eval_classifier.py --checks eval-equivalence
    ddp-conformance run --target my_target.py --checks eval-equivalence

Contract: a distributed evaluation must compute the metric of the whole eval set, every sample
counted once, whatever the world size: the number a training script logs is the number a
single process would have computed. ``DistributedSampler`` breaks it by default (it pads the
dataset with repeats to a multiple of the world size, pytorch/pytorch#25162), as do averaging
per-rank means over uneven shards, logging a rank's own value, evaluating in train mode
(BatchNorm normalising with batch statistics and updating its running statistics with the eval
set), and all_gather of per-rank predictions of different lengths. DDP's own contract adds that
forward is a synchronisation point (an evaluation on some ranks only leaves the others waiting)
and that a forward with autograd on prepares a reduction for a backward.

What runs: the target's ``evaluate(model, ctx)`` on the DDP model built from the suite's seed,
on N ranks in a fresh world with a short process-group timeout (an evaluation that hangs
releases its ranks by that timeout and dies with that world), then one training step on every
rank; and the same ``evaluate`` in the 1-rank world, the reference. Probes on each rank
(``harness.observe``, ``evaluation.observers``) record the sample indices the DataLoaders fetched, the forward's calls,
rows, mode and autograd state, the collectives with their small inputs and outputs, the buffers
before and after, the gradients. The judge (``evaluation.judge``) compares every metric with the
1-rank value within sqrt(n) float32 epsilons (docs/numerics.md) and across ranks, and names a
cause only where the records measure it.

Evidence: ``metrics`` (per metric: the 1-rank value, every rank's, the tolerance, max |Δ|),
``samples`` (expected, seen per rank, duplicated and missing indices, the DistributedSampler's
arithmetic), ``hygiene`` (train-mode modules, forwards with autograd, buffers changed, gradients
written, the training step's error), ``collectives`` per rank, ``causes``. A target without
``evaluate`` skips the check; so does an ``evaluate`` that ran no forward of the model on any rank
nor on one (metrics returned without evaluating agree on every world size: they verify nothing).
"""

from __future__ import annotations

from ..harness.context import CheckContext
from ..harness.failures import world_error_outcome
from ..harness.outcome import Outcome
from ..harness.timing import EVAL_PG_TIMEOUT_S
from ..harness.world import RankFailure, WorldHang
from .evaluation import EvalRank, deadlocked, evaluate_on_rank, failed_world, verdict


def _n_ranks(ctx: CheckContext) -> list[EvalRank]:
    if ctx.new_world is None:  # --attach: the only world there is
        return [r.value for r in ctx.world().run(evaluate_on_rank, ctx.target.spec, train_after=True,
                                                 deadline=ctx.deadline)]
    with ctx.fresh_world(pg_timeout=min(EVAL_PG_TIMEOUT_S, ctx.deadline / 2)) as world:
        return [r.value for r in world.run(evaluate_on_rank, ctx.target.spec, train_after=True,
                                           deadline=ctx.deadline)]


def run(ctx: CheckContext) -> Outcome:
    if not ctx.target.has("evaluate"):
        return Outcome.skipped(f"target {ctx.target.name!r} defines no evaluate(model, ctx): no distributed "
                               f"evaluation to compare (see the README section 'Writing a target')")
    if ctx.world_size < 2:
        return Outcome.skipped("one rank: there is no N-rank evaluation to compare with the 1-rank one")
    try:
        ranks = _n_ranks(ctx)
    except (RankFailure, WorldHang) as exc:
        # A rank that died (gloo aborts a process on a collective mismatch) or stayed stuck past
        # the deadline: the ranks that returned still say what they did (no forward at all...).
        described = {r.rank: r.error.describe() for r in exc.results if r.error is not None}
        return failed_world(exc.results, described) or world_error_outcome(exc, "the target's evaluate")
    # Before the reference: the 1-rank run of a deadlocking evaluate raises its own error (no
    # peer to wait for), or hangs until the deadline, either of which would hide this finding.
    if (hung := deadlocked(ranks)) is not None:
        return hung
    try:
        reference = ctx.world(1).run(evaluate_on_rank, ctx.target.spec, train_after=False,
                                     deadline=ctx.deadline)[0].value
    except (RankFailure, WorldHang) as exc:
        return Outcome.inconclusive(f"the 1-rank reference evaluation failed: {exc}",
                                    metrics={"key_figure": "no 1-rank reference"})
    return verdict(ranks, reference)
