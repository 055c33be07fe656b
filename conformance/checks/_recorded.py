"""One recorded training run of the target: the rank-side experiment of the equivalence checks.

Build the target's model from the suite's seed, wrap it in DDP with the target's
``ddp_kwargs``, feed each rank its contiguous shard of the global batch as K microbatches, run
the target's own ``train_step`` and record what the optimizer consumed. The single-process
reference is the *same function* run in a 1-rank world with the whole global batch, so nothing
about "what a step should do" is re-implemented here.

Recorded per step (see ``_instruments``): the gradients at the first ``optimizer.step()``
(a step pre-hook: ``zero_grad`` before or after the step, ``set_to_none`` or not, all read
the same), how many optimizer steps, forwards through DDP and through the inner module,
all-reduce calls and rounds (a counting comm hook), what ``clip_grad_norm_`` measured and the
gradients before it clipped them, and the first NaN/Inf (forward output, gradient, parameter).
Before the run, dropout is switched off and BatchNorm normalises in fixed groups on both sides
(``_randomness``, ``_normalisation``): the record says so.

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
    param_state,
    shard,
    tensor_digest,
    to_device,
    unwrap,
    wrap,
)
from ._instruments import ClipProbe, ForwardCounter, StepRecorder, first_nonfinite
from ._normalisation import group_batchnorm, sizes_seen
from ._randomness import disable_dropout, forward_is_random

GRADIENT_AFTER_FINITE_FORWARD = ("gradient at optimizer.step() (the forward's outputs were finite: "
                                 "the loss or the backward produced it)")


@dataclass(frozen=True, slots=True)
class RunPlan:
    """One recorded training run on every rank of a world.

    ``microbatches`` is K *per rank*. ``norm_group`` is the N-rank run's microbatch size
    B/(N·K): both the N-rank run and its reference normalise BatchNorm over groups of it.
    """

    target_spec: str
    global_batch: int
    microbatches: int = 1
    steps: int = 3
    seed: int = MODEL_SEED
    norm_group: int = 0  # 0: global_batch / microbatches on this world (set by for_world)
    ddp_overrides: dict[str, Any] = field(default_factory=dict)
    count_allreduce: bool = True
    record_all_ranks: bool = True

    def __post_init__(self) -> None:
        if self.steps < 1 or self.microbatches < 1 or self.global_batch < 1 or self.norm_group < 0:
            raise ValueError(f"steps={self.steps}, microbatches={self.microbatches}, "
                             f"global_batch={self.global_batch} must all be >= 1 and "
                             f"norm_group={self.norm_group} >= 0")


def _nonfinite_output(output: Any) -> bool:
    import torch

    tensors = output if isinstance(output, (tuple, list)) else (output,)
    return any(isinstance(t, torch.Tensor) and t.is_floating_point()
               and not bool(torch.isfinite(t.detach()).all()) for t in tensors)


def run_recorded(rank_ctx: Any, plan: RunPlan, initial: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run ``plan.steps`` steps of the target's ``train_step`` under DDP on this rank.

    Returns (rank 0 always, other ranks when ``plan.record_all_ranks``): ``initial`` (rank 0's
    parameters and buffers after DDP's broadcast, to seed the reference), ``grads0`` (the
    gradients consumed by the first ``optimizer.step()`` that ran, at step ``grads0_step``:
    0 unless a GradScaler skipped steps), ``pre_clip0`` (the gradients before that step's last
    clip, when the step clips), ``params`` (after every step), and per step:
    ``optimizer_steps``, ``ddp_forwards``, ``inner_forwards``, ``allreduce_calls``,
    ``allreduce_rounds``, ``buckets_per_step``, ``clip_calls``; once: ``nonfinite`` (the
    first NaN/Inf), ``dropout_disabled``, ``rng_in_forward``, ``batchnorm_grouped``,
    ``batchnorm_sizes_seen``. ``initial`` given: load it before wrapping (the reference
    starts where rank 0 started).
    """
    from ..harness.targets import load_target

    disable_tf32()
    n, rank = rank_ctx.world_size, rank_ctx.rank
    target = load_target(plan.target_spec)
    model = build_model(target, rank_ctx.device, seed=plan.seed)
    if initial is not None:
        model.load_state_dict(initial)
    first = to_device(shard(global_batch(target, plan.global_batch, seed=plan.seed), rank, n,
                            plan.microbatches), rank_ctx.device)[0]
    dropout = disable_dropout(model)
    # After switching dropout off: what randomness is left cannot be made equal on both sides.
    rng_left = forward_is_random(model, lambda m: target.compute_loss(m, *first), device=rank_ctx.device)
    group = plan.norm_group or plan.global_batch // (n * plan.microbatches)
    grouped = group_batchnorm(model, group)
    kwargs = effective_ddp_kwargs(target, plan.ddp_overrides)
    ddp = wrap(model, rank_ctx.device, kwargs)
    inner = unwrap(ddp)
    optimizer = target.make_optimizer(ddp)
    record = rank == 0 or plan.record_all_ranks
    out: dict[str, Any] = {"rank": rank, "ddp_kwargs": repr(kwargs), "dropout_disabled": dropout,
                           "rng_in_forward": rng_left, "batchnorm_grouped": grouped,
                           "batchnorm_group": group if grouped else None}
    if rank == 0:
        out["initial"] = {k: v.detach().cpu().clone() for k, v in inner.state_dict().items()}
    per_step: dict[str, list[Any]] = {k: [] for k in (
        "optimizer_steps", "ddp_forwards", "inner_forwards", "allreduce_calls", "allreduce_rounds",
        "buckets_per_step", "clip_calls", "batch_digests")}
    params: list[dict[str, Any]] = []
    nonfinite: dict[str, Any] | None = None
    current = {"step": 0}

    def watch_output(module: Any, args: Any, output: Any) -> None:
        nonlocal nonfinite
        if nonfinite is None and _nonfinite_output(output):
            nonfinite = {"step": current["step"], "kind": "forward output (loss or logits)",
                         "name": type(module).__name__}

    namespaces = [vars(target.module), getattr(target.train_step, "__globals__", {})]
    with contextlib.ExitStack() as stack:
        counts = stack.enter_context(counting_allreduce(ddp)) if plan.count_allreduce else None
        recorder = StepRecorder.attach(inner, optimizer)
        stack.callback(recorder.close)
        forwards = ForwardCounter.attach(ddp, inner)
        stack.callback(forwards.close)
        clip = ClipProbe.attach(inner, namespaces)
        stack.callback(clip.close)
        stack.callback(inner.register_forward_hook(watch_output).remove)
        for step in range(plan.steps):
            current["step"] = step
            batch = global_batch(target, plan.global_batch, seed=plan.seed + step)
            # Every rank draws the *same* global batch from the same seed, unless the data it
            # draws from was built differently in this process (a per-rank dataset).
            per_step["batch_digests"].append(tensor_digest(batch[0]) + tensor_digest(batch[1]))
            micro = to_device(shard(batch, rank, n, plan.microbatches), rank_ctx.device)
            before = (counts["calls"], counts["rounds"]) if counts is not None else (0, 0)
            if counts is not None:
                counts["indices"] = set()
            recorder.reset()
            clip.calls = []
            if "grads0" not in out:
                clip.pre_clip, clip.frozen = None, False
            # train_step runs forward/backward on every rank: each backward that is not under
            # no_sync is a collective, so all ranks execute the same number of steps.
            target.run_step(ddp, optimizer, micro, step=step)
            per_step["optimizer_steps"].append(recorder.steps)
            ddp_fw, inner_fw = forwards.take()
            per_step["ddp_forwards"].append(ddp_fw)
            per_step["inner_forwards"].append(inner_fw)
            per_step["clip_calls"].append(list(clip.calls))
            if counts is not None:
                per_step["allreduce_calls"].append(counts["calls"] - before[0])
                per_step["allreduce_rounds"].append(counts["rounds"] - before[1])
                # DDP rebuilds its buckets after the first iteration (in gradient-ready
                # order), so the bucket count is measured per step, not once.
                per_step["buckets_per_step"].append(len(counts["indices"]))
            grads = recorder.grads or {}
            state = param_state(ddp)
            if nonfinite is None:
                # The forward hook saw finite outputs this step: a NaN/Inf gradient then comes from
                # the loss computed on them, or from the backward.
                for kind, tensors in ((GRADIENT_AFTER_FINITE_FORWARD, grads), ("parameter", state)):
                    bad = first_nonfinite(tensors.items())
                    if bad is not None:
                        nonfinite = {"step": step, "kind": kind, "name": bad}
                        break
            if "grads0" not in out and recorder.grads is not None:
                # The first step whose optimizer.step() ran (a GradScaler skips steps with inf
                # gradients, typically the first ones under fp16): its gradients are compared.
                # Before it no parameter moved, so both sides still start from the same weights.
                out["grads0"] = recorder.grads if record else None
                out["grads0_step"] = step
                out["pre_clip0"] = clip.pre_clip if record else None
                clip.frozen = True
            if record:
                params.append(state)
    out.setdefault("grads0", None)
    out.setdefault("grads0_step", None)
    out.setdefault("pre_clip0", None)
    out.update(per_step)
    out["params"] = params
    out["nonfinite"] = nonfinite
    out["batchnorm_sizes_seen"] = sizes_seen(inner)
    return out
