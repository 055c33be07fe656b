"""Check ``gradient-equivalence``: an N-rank DDP step equals the single-process large-batch step.

    ddp-conformance run --checks gradient-equivalence                    # the built-in targets
    ddp-conformance run --checks gradient-equivalence --target my_target.py

Contract (DDP docs, "DDP is mathematically equivalent to single-process training on the
global batch"; docs/ddp-background.md): with identical initial parameters (DDP broadcasts rank 0's at
construction), gradients all-reduced and divided by N, and a loss that is a *mean* over
samples, the gradient on each rank after backward equals the gradient of the global batch.
Users break it with a loss that is a sum or is rescaled by the world size, with clipping or
scaling done before the synchronisation, with state outside the module.

What runs: the target's ``train_step`` under DDP (its ``ddp_kwargs``) on N ranks, each rank
on its contiguous shard of ``make_batch(Generator().manual_seed(seed+step), B)``, for 3 steps;
the reference is the *same* ``train_step`` in a real 1-rank world on the whole global batch,
starting from rank 0's parameters after DDP's broadcast (see ``_equivalence``). First-step
gradients are compared before any later step (Adam normalises its update, so a gradient 2x
too large moves fp32 parameters by only ~1e-7..1e-4 — the gradient shows it, the parameters
barely do); parameters after every step catch what happens later (optimizer state, clipping).

Evidence: ``max_abs_grad_diff``, ``max_rel_grad_diff``, ``worst_grad_param``, tolerances,
``max_abs_param_diff``, ``worst_param``, ``first_diverging_step``, per-parameter tables
(``first_step_gradients``, ``parameters_after_each_step``). Tolerances: ``_compare``.
"""

from __future__ import annotations

from typing import Any

from ..harness.outcome import Outcome
from ..harness.world import RankFailure, WorldHang
from ._equivalence import run_equivalence, world_error_outcome

STEPS = 3


def run(ctx: Any) -> Outcome:
    try:
        eq = run_equivalence(ctx, microbatches=1, steps=STEPS)
    except (RankFailure, WorldHang) as exc:
        return world_error_outcome(exc, "the DDP training step")
    metrics = {**eq.metrics(), "key_figure": eq.key_figure()}
    if eq.ok:
        return Outcome.passed(
            f"{ctx.world_size}-rank DDP matches the single-process step on batch "
            f"{eq.plan.global_batch} over {STEPS} steps ({eq.key_figure()})",
            metrics=metrics, evidence=eq.evidence())
    wg = eq.worst_grad
    hint = ""
    if wg is not None and not wg.ok and wg.max_rel > 0.2:
        hint = (f" — a relative error of {wg.max_rel:.2f} is what a loss rescaled by the world "
                f"size or summed instead of averaged produces")
    return Outcome.failed(
        f"DDP step differs from the single-process large-batch step: {eq.mismatch_message()}{hint}",
        metrics=metrics, evidence=eq.evidence(),
        recommendation="the loss must be a mean over the local samples (DDP averages gradients "
                       "over ranks: do not multiply by the world size); clip and scale gradients "
                       "only after backward has synchronised them; keep all state in the module")
