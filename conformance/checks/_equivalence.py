"""The N-rank run against its 1-rank reference: the experiment behind both equivalence checks.

Supervisor side. The N-rank run goes to the session's persistent world; its rank 0 returns the
parameters and buffers it holds after DDP's construction broadcast, which seed the reference:
the same ``run_recorded`` on the persistent 1-rank world, with the whole global batch (as one
microbatch, or as the N·K microbatches of the N-rank run when the model has BatchNorm, whose
statistics DDP keeps per rank). The judge compares first-step gradients and the parameters
after every step, rank by rank, within the dtype tolerance of ``_compare``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from reports.keys import BATCHNORM_PER_RANK, WARNINGS

from ..harness.outcome import Outcome
from ..harness.world import RankFailure, WorldHang
from ._compare import TensorDiff, diff_states, fmt, worst
from ._recorded import RunPlan, run_recorded


@dataclass(frozen=True, slots=True)
class Equivalence:
    plan: RunPlan
    reference_microbatches: int
    local_batchnorm: bool
    grad_diffs: list[TensorDiff]  # per parameter: the worst rank's first-step gradient
    grad_worst_rank: dict[str, int]
    param_diffs: list[list[TensorDiff]]  # per step, per parameter (worst rank)
    ranks: list[dict[str, Any]]  # the N-rank values (counts etc.), without tensors

    @property
    def worst_grad(self) -> TensorDiff | None:
        return worst(self.grad_diffs)

    @property
    def worst_param(self) -> TensorDiff | None:
        return worst([d for step in self.param_diffs for d in step])

    @property
    def first_bad_step(self) -> int | None:
        for step, diffs in enumerate(self.param_diffs):
            if any(not d.ok for d in diffs):
                return step
        return None

    @property
    def ok(self) -> bool:
        return all(d.ok for d in self.grad_diffs) and self.first_bad_step is None

    def metrics(self) -> dict[str, Any]:
        wg, wp = self.worst_grad, self.worst_param
        return {
            "world_size": None if not self.ranks else len(self.ranks),
            "global_batch": self.plan.global_batch,
            "microbatches_per_rank": self.plan.microbatches,
            "reference_microbatches": self.reference_microbatches,
            "steps": self.plan.steps,
            "max_abs_grad_diff": wg.max_abs if wg else 0.0,
            "max_rel_grad_diff": wg.max_rel if wg else 0.0,
            "grad_atol": wg.tolerance.atol if wg else None,
            "grad_rtol": wg.tolerance.rtol if wg else None,
            "worst_grad_param": wg.name if wg else None,
            "max_abs_param_diff": wp.max_abs if wp else 0.0,
            "max_rel_param_diff": wp.max_rel if wp else 0.0,
            "param_atol": wp.tolerance.atol if wp else None,
            "param_rtol": wp.tolerance.rtol if wp else None,
            "worst_param": wp.name if wp else None,
            "first_diverging_step": self.first_bad_step,
        }

    def evidence(self) -> dict[str, Any]:
        last = self.param_diffs[-1] if self.param_diffs else []
        return {
            "first_step_gradients": [dict(d.to_json(), rank=self.grad_worst_rank.get(d.name))
                                     for d in self.grad_diffs],
            "parameters_after_each_step": [
                {"step": s, "worst": (worst(diffs).to_json() if diffs else None),
                 "outside_tolerance": [d.name for d in diffs if not d.ok]}
                for s, diffs in enumerate(self.param_diffs)],
            "parameters_after_last_step": [d.to_json() for d in last],
            "ddp_kwargs": self.ranks[0].get("ddp_kwargs") if self.ranks else None,
            # Plain BatchNorm normalises over each rank's shard, so DDP equals large-batch
            # training only up to per-rank statistics: conformant, but worth a warning.
            BATCHNORM_PER_RANK: self.local_batchnorm,
            WARNINGS: (["BatchNorm statistics are computed per rank (per microbatch), not over "
                          "the global batch; the reference was run with the same microbatches. "
                          "Use SyncBatchNorm if per-GPU batches are small."]
                         if self.local_batchnorm else []),
        }

    def key_figure(self) -> str:
        wg, wp = self.worst_grad, self.worst_param
        if wp is not None and not wp.ok and (wg is None or wg.ok):
            return (f"max |Δparam| {fmt(wp.max_abs)} = {wp.ratio:.2g}× tolerance "
                    f"(step {self.first_bad_step})")
        if wg is None:
            return "no gradients compared"
        return f"max |Δgrad| {fmt(wg.max_abs)} = {fmt(wg.ratio)}× tolerance"

    def mismatch_message(self) -> str:
        wg, wp = self.worst_grad, self.worst_param
        parts = []
        if wg is not None and not wg.ok:
            parts.append(f"first-step gradient of {wg.name!r} differs from the single-process "
                         f"reference by {fmt(wg.max_abs)} (rel {fmt(wg.max_rel)}) on rank "
                         f"{self.grad_worst_rank.get(wg.name)}, tolerance {wg.tolerance.describe()}"
                         + (f" ({wg.note})" if wg.note else ""))
        if wp is not None and not wp.ok:
            parts.append(f"parameters diverge from step {self.first_bad_step}: worst {wp.name!r} "
                         f"by {fmt(wp.max_abs)} (tolerance {wp.tolerance.describe()})")
        return "; ".join(parts)


def _merge_worst(per_rank: list[list[TensorDiff]]) -> tuple[list[TensorDiff], dict[str, int]]:
    """Per parameter name, the rank whose difference is the largest."""
    best: dict[str, tuple[TensorDiff, int]] = {}
    for rank, diffs in enumerate(per_rank):
        for d in diffs:
            if d.name not in best or d.ratio > best[d.name][0].ratio:
                best[d.name] = (d, rank)
    return [v[0] for v in best.values()], {k: v[1] for k, v in best.items()}


def run_equivalence(ctx: Any, *, microbatches: int, steps: int = 3,
                    count_allreduce: bool = False) -> Equivalence:
    """N-rank run on the persistent world, reference on the persistent 1-rank world, judged."""
    n = ctx.world_size
    plan = RunPlan(target_spec=ctx.target.spec,
                   global_batch=ctx.target.batch_size_for(n, microbatches),
                   microbatches=microbatches, steps=steps, count_allreduce=count_allreduce)
    # Both calls carry the check's deadline: a target whose step hangs under DDP (an unused
    # parameter with find_unused_parameters=False on some ranks) must become a verdict.
    values = [r.value for r in ctx.world().run(run_recorded, plan, deadline=ctx.deadline)]
    local_bn = bool(values[0]["local_batchnorm"])
    ref_k = n * microbatches if local_bn else 1
    ref_plan = replace(plan, microbatches=ref_k, count_allreduce=False)
    ref = ctx.world(world_size=1).run(run_recorded, ref_plan, values[0]["initial"],
                                      deadline=ctx.deadline)[0].value
    grads, grad_rank = _merge_worst([diff_states(v["grads0"], ref["grads0"], grad=True)
                                     for v in values])
    params = []
    for step in range(steps):
        merged, _ = _merge_worst([diff_states(v["params"][step], ref["params"][step], grad=False)
                                  for v in values])
        params.append(merged)
    summaries = [{k: v for k, v in val.items() if k not in ("initial", "grads0", "params")}
                 for val in values]
    return Equivalence(plan, ref_k, local_bn, grads, grad_rank, params, summaries)


def world_error_outcome(exc: Exception, what: str) -> Outcome:
    """A DDP run that raised or hung on the target is a failed check, with every rank's story."""
    if isinstance(exc, WorldHang):
        return Outcome.failed(
            f"{what} hung: ranks {exc.stuck_ranks} did not finish within the deadline",
            metrics={"key_figure": f"hang after {exc.elapsed_s:.1f} s", "stuck_ranks": exc.stuck_ranks},
            evidence={"stacks": {str(k): v[-4000:] for k, v in exc.stacks.items()}},
            recommendation="every rank must run the same collectives: make every parameter take "
                           "part in every step, or see the unused-parameters check")
    assert isinstance(exc, RankFailure)
    errors = {str(r.rank): r.error.describe() for r in exc.results if r.error is not None}
    traces = {str(r.rank): r.error.traceback[-3000:] for r in exc.results
              if r.error is not None and r.error.traceback}
    first = next(iter(errors.items()), ("?", str(exc)))
    return Outcome.failed(
        f"{what} raised on rank {first[0]}: {first[1].splitlines()[0][:300]}",
        metrics={"key_figure": "DDP step raised", "failed_ranks": exc.failed_ranks},
        evidence={"rank_errors": errors, "tracebacks": traces})
