"""Check ``gradient-equivalence``: an N-rank DDP step equals the single-process large-batch step.

    ddp-conformance run --checks gradient-equivalence                    # the built-in targets
    ddp-conformance run --checks gradient-equivalence --target my_target.py

Contract (DDP docs, "DDP is mathematically equivalent to single-process training on the
global batch"; docs/ddp-background.md): with identical initial parameters (DDP broadcasts rank 0's at
construction), gradients all-reduced and divided by N, and a loss that is a *mean* over
samples, the gradient on each rank after backward equals the gradient of the global batch.
Users break it with a loss that is a sum or is rescaled by the world size, with clipping or
scaling done before the synchronisation, with a forward that bypasses the DDP wrapper, with
state outside the module.

What runs: the target's ``train_step`` under DDP (its ``ddp_kwargs``) on N ranks, each rank
on its contiguous shard of ``make_batch(Generator().manual_seed(seed+step), B)``, for 3 steps;
the reference is the *same* ``train_step`` in a real 1-rank world on the whole global batch,
starting from rank 0's parameters after DDP's broadcast (see ``equivalence.experiment``). Judged: the
gradients ``optimizer.step()`` consumed at step 0 (a step pre-hook, so ``zero_grad`` before
or after the step makes no difference; Adam normalises its update, so a gradient 2x too large
moves fp32 parameters by only ~1e-7..1e-4 — the gradient shows it, the parameters barely do),
the gradients before clipping when the step clips, and the parameters after every step.
Dropout is switched off and BatchNorm normalises in equal groups on both sides (recorded).

Evidence: ``compared`` (parameters with and without a gradient, optimizer steps, forwards
through DDP and the module, all-reduce rounds), ``max_abs_grad_diff``, ``max_rel_grad_diff``,
``worst_grad_param``, tolerances, ``max_abs_param_diff``, ``worst_param``,
``first_diverging_step``, ``gradient_scale`` (per-parameter factor against the reference, the
measurement behind a "loss scaled by N" hint), ``hypotheses``, per-parameter tables.
Verdicts: NaN/Inf anywhere → failed (step and rank named); no gradient reached the optimizer
→ skipped. Tolerances: the fixed ones of ``equivalence.tensors`` as the lower bound, widened to the
measured noise floor of this configuration (``equivalence.floor``: a single-process twin on the N-rank
run's microbatches, margin 4) and, with a comm hook, its compression bound against the
uncompressed reference (``equivalence.compression``); a floor too wide to tell a loss scaled by N from
noise → inconclusive. Evidence ``noise_floor``; docs/numerics.md.
"""

from __future__ import annotations

from ..harness.context import CheckContext
from ..harness.failures import world_error_outcome
from ..harness.outcome import Outcome
from ..harness.world import RankFailure, WorldHang
from . import equivalence
from .equivalence import judge, name_known_cause, run_equivalence

STEPS = 3


def run(ctx: CheckContext) -> Outcome:
    try:
        eq = run_equivalence(ctx, microbatches=1, steps=STEPS)
    except (RankFailure, WorldHang) as exc:
        return name_known_cause(ctx, exc, world_error_outcome(exc, "the DDP training step"))
    verdict = judge(eq, what=f"the {eq.wrapper} step",
                    recommendation="the loss must be a mean over the local samples (DDP averages "
                                   "gradients over ranks: do not multiply by the world size); call "
                                   "the DDP model, not model.module; clip and scale gradients only "
                                   "after backward has synchronised them; keep all state in the module")
    if verdict is not None:
        return verdict
    figure = equivalence.key_figure(eq)
    return Outcome.passed(
        f"{ctx.world_size}-rank {eq.wrapper} matches the single-process step on batch "
        f"{eq.plan.global_batch} over {STEPS} steps: {len(eq.grad_diffs)} "
        f"{eq.consumed} ({figure})"
        + (f"; no gradient on {len(eq.no_gradient)} parameter(s) in either run" if eq.no_gradient else ""),
        metrics={**equivalence.metrics(eq), "key_figure": figure}, evidence=equivalence.evidence(eq))
