"""One recorded training run of the target: the rank-side experiment of the equivalence checks.

Build the target's model from the suite's seed, wrap it in DDP with the target's
``ddp_kwargs``, feed each rank its contiguous shard of the global batch as K microbatches, run
the target's own ``train_step`` and record gradients and parameters. The single-process
reference is the *same function* run in a 1-rank world with the whole global batch, so nothing
about "what a step should do" is re-implemented here.

``run_recorded`` is module-level so that it pickles by reference into the spawned rank
processes; it returns CPU tensors and plain Python only.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from ..harness.ddp import (
    MODEL_SEED,
    build_model,
    counting_allreduce,
    disable_tf32,
    effective_ddp_kwargs,
    global_batch,
    grad_state,
    has_local_batchnorm,
    param_state,
    shard,
    to_device,
    unwrap,
    wrap,
)


@dataclass(frozen=True, slots=True)
class RunPlan:
    """One recorded training run on every rank of a world.

    ``microbatches`` is K *per rank*; the reference passes the N-rank run's K (or N·K for
    models whose BatchNorm statistics are per microbatch, see ``has_local_batchnorm``).
    """

    target_spec: str
    global_batch: int
    microbatches: int = 1
    steps: int = 3
    seed: int = MODEL_SEED
    ddp_overrides: dict[str, Any] = field(default_factory=dict)
    count_allreduce: bool = False
    record_all_ranks: bool = True

    def __post_init__(self) -> None:
        if self.steps < 1 or self.microbatches < 1 or self.global_batch < 1:
            raise ValueError(f"steps={self.steps}, microbatches={self.microbatches} and "
                             f"global_batch={self.global_batch} must all be >= 1")


def run_recorded(rank_ctx: Any, plan: RunPlan, initial: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run ``plan.steps`` steps of the target's ``train_step`` under DDP on this rank.

    Returns (rank 0 always, other ranks when ``plan.record_all_ranks``): ``initial`` (the
    parameters and buffers after DDP's broadcast, to seed the reference), ``grads0`` (the
    gradients ``train_step`` left after step 0: synchronised, before any later step),
    ``params`` (parameters after every step), and all-reduce counts per step when asked.
    ``initial`` given: load it before wrapping (the reference starts where rank 0 started).
    """
    from ..harness.targets import load_target

    disable_tf32()
    target = load_target(plan.target_spec)
    model = build_model(target, rank_ctx.device, seed=plan.seed)
    if initial is not None:
        model.load_state_dict(initial)
    kwargs = effective_ddp_kwargs(target, plan.ddp_overrides)
    ddp = wrap(model, rank_ctx.device, kwargs)
    optimizer = target.build_optimizer(ddp.parameters())
    record = rank_ctx.rank == 0 or plan.record_all_ranks
    out: dict[str, Any] = {"rank": rank_ctx.rank, "ddp_kwargs": repr(kwargs),
                           "local_batchnorm": has_local_batchnorm(model)}
    if rank_ctx.rank == 0:
        out["initial"] = {k: v.detach().cpu().clone() for k, v in unwrap(ddp).state_dict().items()}
    counter = contextlib.ExitStack()
    counts = counter.enter_context(counting_allreduce(ddp)) if plan.count_allreduce else None
    params, calls, rounds, buckets = [], [], [], []
    with counter:
        for step in range(plan.steps):
            batch = global_batch(target, plan.global_batch, seed=plan.seed + step)
            micro = to_device(shard(batch, rank_ctx.rank, rank_ctx.world_size, plan.microbatches),
                              rank_ctx.device)
            before = dict(counts) if counts is not None else None
            if counts is not None:
                counts["indices"] = set()
            # train_step runs forward/backward on every rank: each backward that is not under
            # no_sync is a collective, so all ranks execute the same number of steps.
            target.train_step(ddp, optimizer, micro, target.loss_fn)
            if counts is not None and before is not None:
                calls.append(counts["calls"] - before["calls"])
                rounds.append(counts["rounds"] - before["rounds"])
                # DDP rebuilds its buckets after the first iteration (in gradient-ready
                # order), so the bucket count is measured per step, not once.
                buckets.append(len(counts["indices"]))
            if record and step == 0:
                out["grads0"] = grad_state(ddp)
            if record:
                params.append(param_state(ddp))
    out["params"] = params
    if counts is not None:
        out["allreduce_calls"] = calls
        out["allreduce_rounds"] = rounds
        out["buckets_per_step"] = buckets
    return out
