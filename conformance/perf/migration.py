"""Check ``ddp-migration``: the target's DDP version beside its ``parallelize`` port, side by side.

    ddp-conformance run --target examples/train_fsdp2.py --compare-ddp
    ddp-conformance run --target examples/train_fsdp2.py --checks ddp-migration

Runs with ``--compare-ddp`` (added to the selection), or when named. What the equivalence
checks cannot show is what the port costs and what it leaves behind: each way — through DDP
with the target's ``ddp_kwargs`` and ``configure_ddp`` (``SPEC#ddp``), and through its
``parallelize`` — runs the target's own ``train_step`` for a few steps on every rank from the
same seed, and each rank measures:

- its peak memory over the step (the process's ``VmHWM``, reset before the model is built, as
  the model-scale benchmark measures a rank; on CUDA ``max_memory_allocated`` too);
- the median step time (the device synchronised);
- the collectives per step, by what the wrapper issues: DDP's bucket all-reduces (its comm hook
  chain, ``observe.comm_rounds``), FSDP2's all-gathers / reduce-scatters / all-reduces
  (``torch.distributed`` calls, ``observe.CallCounts``);
- after the steps, each parameter's full tensor's sum and norm (the two runs agree within the
  tolerance of a different reduction order), and what the port changed that production code
  reads: the optimizer's ``state_dict()`` (DTensor shards under FSDP2), the gradients' kind
  (DTensor shards: a norm computed by hand from ``to_local()`` is the shard's), a GradScaler
  stepped (its found-inf is per rank).

The hazards (``hazards``) are each such measurement, and each ``ddp_kwargs`` key, said in terms
of what FSDP2 does instead. The check passes when both ways ran (the equivalence checks judge
the training step; this one reports); a parameter that parts between the two beyond tolerance
fails it. Evidence: ``migration`` (per wrapper, per rank: the figures above), ``hazards``.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass
from typing import Any

from ..harness.context import CheckContext
from ..harness.failures import world_error_outcome
from ..harness.outcome import Outcome
from ..harness.parallel import COLLECTIVE_WORDS, FSDP2_WRAPPERS
from ..harness.world import RankContext, RankFailure, WorldHang
from ddp_conformance.reports.keys import MIGRATION, WARNINGS

WARMUP, STEPS = 1, 3

#: Relative difference of a parameter's sum or norm between the two ways beyond which they
#: parted (float32 with another reduction order agrees to ~1e-6 over a few steps).
PARAM_RTOL = 1e-4

#: What each DDP constructor argument means once DDP is gone (the hazard said for each key set).
DDP_KWARGS_UNDER_FSDP2 = {
    "find_unused_parameters": "FSDP2 has no such flag: each fully_shard group reduces when its backward runs, "
                              "a parameter without a gradient reduces zeros",
    "bucket_cap_mb": "FSDP2 has no buckets: each fully_shard group is one reduce-scatter, so the modules you "
                     "shard set the message sizes",
    "gradient_as_bucket_view": "FSDP2 has no buckets: its gradients are DTensor shards of their own",
    "static_graph": "FSDP2 has no static-graph mode: it re-plans nothing per iteration",
    "broadcast_buffers": "FSDP2 never broadcasts buffers: each rank keeps its own (BatchNorm statistics drift "
                         "apart per rank unless you use SyncBatchNorm)",
    "bucket_cap_mb_first": "FSDP2 has no first bucket",
    "mixed_precision": "FSDP2 spells it fully_shard(..., mp_policy=MixedPrecisionPolicy(...))",
    "init_sync": "FSDP2 does not broadcast at construction: every rank must build the same weights",
    "skip_all_reduce_unused_params": "FSDP2 has no such flag",
}


@dataclass(frozen=True, slots=True)
class StepCost:
    """One rank's training steps through one wrapper (plain data: it crosses the world's pipe)."""

    wrapper: str
    rank: int
    peak_rss: int  # bytes: the process's high-water mark over the build and the steps
    baseline_rss: int  # bytes: its resident set before the model was built
    cuda_peak: int | None
    step_s: float  # median
    collectives_per_step: dict[str, float]
    params: dict[str, tuple[float, float]]  # name -> (sum, norm) of the full tensor
    optimizer_state_dtensors: int  # entries of optimizer.state_dict()["state"] that are sharded DTensors
    optimizer_state_tensors: int
    dtensor_grads: int  # gradients that are sharded DTensors
    grads: int
    scaler_steps: int


def _vm(field: str) -> int:
    """A ``kB`` field of this process's ``/proc/self/status`` in bytes (``VmHWM``: the high-water
    mark ``resources.reset_peak`` resets, as the model-scale benchmark reads a rank's peak)."""
    with open("/proc/self/status") as fh:
        return next((int(line.split()[1]) * 1024 for line in fh if line.startswith(field + ":")), 0)


def step_cost(rank_ctx: RankContext, target_spec: str, warmup: int, steps: int) -> StepCost:
    """The target's ``train_step`` on this rank through the wrapper ``target_spec`` names
    (``SPEC#ddp``: DDP), measured (module docstring). Every rank runs it: it trains."""
    import torch

    from ..harness.ddp import MODEL_SEED, sync_device, unwrap
    from ..harness.observe import Counts, OptimizerSteps, tap
    from ..harness.observe.comm_rounds import FSDP2_REDUCTIONS, counting_allreduce
    from ..harness.parallel import DDP, FSDP2_ALL_GATHERS, full, wrapper_of
    from ..harness.rank_run import RankRun
    from ..harness.resources import reset_peak
    from ..harness.sharding import rank_batch

    run = RankRun.load(rank_ctx, target_spec)
    cuda = rank_ctx.device.type == "cuda"
    baseline = _vm("VmRSS")
    reset_peak()
    if cuda:
        torch.cuda.reset_peak_memory_stats(rank_ctx.device)
    wrapped = run.build_wrapped(seed=MODEL_SEED)
    model, optimizer = wrapped.ddp, wrapped.make_optimizer()
    wrapper = wrapper_of(model)
    counts, scaler = Counts(), {"steps": 0}

    def counted(called: Any, proceed: Any) -> Any:
        counts.add(called.name)
        return proceed()

    def scaler_step(original: Any) -> Any:
        def step(self: Any, *args: Any, **kwargs: Any) -> Any:
            scaler["steps"] += 1
            return original(self, *args, **kwargs)
        return step

    times = []
    with contextlib.ExitStack() as stack:
        # DDP's buckets go through its C++ reducer (a comm hook layer sees them, before the
        # stock hook's own dist.all_reduce, which is therefore not counted again); FSDP2's
        # collectives are torch.distributed calls, tapped by name (observe.collectives).
        buckets = stack.enter_context(counting_allreduce(model)) if wrapper == DDP else None
        if buckets is None:
            tap(stack, counted, (*FSDP2_ALL_GATHERS, *FSDP2_REDUCTIONS))
        stack.enter_context(OptimizerSteps(scaler_step=scaler_step).attached())
        for step in range(warmup + steps):
            if step == warmup:  # what the measured steps issued, not the warm-up's
                counts.clear()
                if buckets is not None:
                    buckets["calls"] = 0
            batch = rank_batch(run.target, rank_ctx.rank, rank_ctx.world_size, seed=MODEL_SEED + step,
                               device=rank_ctx.device)
            t0 = time.perf_counter()
            run.target.run_step(model, optimizer, [batch], step=step)
            sync_device(rank_ctx.device)
            times.append(time.perf_counter() - t0)
    issued = {COLLECTIVE_WORDS.get(name, name): n / steps for name, n in counts.items() if n}
    if buckets is not None and buckets["calls"]:
        issued["bucket all-reduces"] = buckets["calls"] / steps
    module = unwrap(model)
    # full(): an all-gather per sharded parameter, on every rank in registration order.
    params = {name: (float(t.detach().double().sum()), float(t.detach().double().norm()))
              for name, p in module.named_parameters() for t in [full(p)]}
    state = [v for entry in optimizer.state_dict().get("state", {}).values() for v in entry.values()
             if isinstance(v, torch.Tensor)]
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    return StepCost(wrapper, rank_ctx.rank, _vm("VmHWM"), baseline,
                    int(torch.cuda.max_memory_allocated(rank_ctx.device)) if cuda else None,
                    statistics.median(times[warmup:]), issued, params,
                    sum(map(_sharded, state)), len(state), sum(map(_sharded, grads)), len(grads), scaler["steps"])


def _sharded(tensor: Any) -> bool:
    """A DTensor sharded over the mesh (a replicated one holds the whole tensor on every rank)."""
    placements = getattr(tensor, "placements", None)
    return placements is not None and not all(p.is_replicate() for p in placements)


def hazards(ddp_kwargs: dict[str, Any], port: list[StepCost]) -> list[str]:
    """What the port changed that production code or settings still assume of DDP, each from a
    measurement of the port's run (or a ``ddp_kwargs`` key the target sets)."""
    first = port[0]
    # The DDP-based composable replicate still takes DDP's arguments: only FSDP2 drops them.
    out = [f"ddp_kwargs {key}={value!r} has no FSDP2 meaning: {DDP_KWARGS_UNDER_FSDP2.get(key, 'FSDP2 ignores it')}"
           for key, value in ddp_kwargs.items() if key != "process_group" and first.wrapper in FSDP2_WRAPPERS]
    if first.dtensor_grads:
        out.append(f"clipping on DTensors: {first.dtensor_grads} of {first.grads} gradients are DTensor shards; "
                   f"torch.nn.utils.clip_grad_norm_ reduces their norm over every rank (call it on every rank), "
                   f"a norm computed by hand from p.grad.to_local() is this rank's shard's")
    if first.optimizer_state_dtensors:
        out.append(f"optimizer state dict format: {first.optimizer_state_dtensors} of "
                   f"{first.optimizer_state_tensors} tensors in optimizer.state_dict() are DTensor shards: "
                   f"torch.save of it on one rank holds that rank's shards only; save and load through "
                   f"torch.distributed.checkpoint.state_dict (get_state_dict / set_optimizer_state_dict)")
    if first.scaler_steps:
        out.append(f"grad scaler: GradScaler.step ran {first.scaler_steps} time(s) on sharded gradients; its "
                   f"inf/NaN check sees only this rank's shards, so every rank must agree on skipping "
                   f"(rank-consistency compares the optimizer state that a one-rank skip leaves behind)")
    return out


def _parted(ddp: StepCost, port: StepCost) -> list[str]:
    """Parameters whose sum or norm differs between the two ways beyond :data:`PARAM_RTOL`."""
    parted = []
    for name, (s, n) in port.params.items():
        other = ddp.params.get(name)
        if other is None:
            continue
        if any(abs(a - b) > PARAM_RTOL * max(abs(a), abs(b), 1e-12) for a, b in ((s, other[0]), (n, other[1]))):
            parted.append(name)
    return parted


def _row(c: StepCost) -> dict[str, Any]:
    return {"wrapper": c.wrapper, "rank": c.rank, "peak_rss": c.peak_rss,
            "step_rss": max(c.peak_rss - c.baseline_rss, 0), "cuda_peak": c.cuda_peak,
            "step_s": round(c.step_s, 6), "collectives_per_step": c.collectives_per_step}


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:.1f} MiB"


def run(ctx: CheckContext) -> Outcome:
    from ..harness.targets.loading import VIA_DDP

    target = ctx.target
    if not target.has("parallelize"):
        return Outcome.skipped("the target defines no parallelize: there is no port to compare with its DDP "
                               "version (docs/targets.md, \"The names\")")
    spec = target.spec.removesuffix(VIA_DDP)
    world = ctx.world()
    try:
        # Unmeasured first: what the first FSDP2 step loads once per process (DTensor's dispatch,
        # its imports) would count in the port's peak and not in DDP's.
        world.run(step_cost, spec, 1, 1, deadline=ctx.deadline)
        port = [r.value for r in world.run(step_cost, spec, WARMUP, STEPS, deadline=ctx.deadline)]
        ddp = [r.value for r in world.run(step_cost, spec + VIA_DDP, WARMUP, STEPS, deadline=ctx.deadline)]
    except (RankFailure, WorldHang) as exc:
        return world_error_outcome(exc, "the migration comparison's training step")
    said = hazards(dict(target.ddp_kwargs), port)
    rows = [_row(c) for c in ddp + port]
    parted = _parted(ddp[0], port[0])
    worst = {side[0].wrapper: max(max(c.peak_rss - c.baseline_rss, 0) for c in side) for side in (ddp, port)}
    steps = {ddp[0].wrapper: max(c.step_s for c in ddp), port[0].wrapper: max(c.step_s for c in port)}
    calls = {ddp[0].wrapper: ddp[0].collectives_per_step, port[0].wrapper: port[0].collectives_per_step}
    side = "; ".join(f"{w}: step peak {_mib(worst[w])} over the rank's baseline (largest rank), "
                     f"{steps[w] * 1e3:.1f} ms/step, collectives/step "
                     + (", ".join(f"{k} {v:g}" for k, v in sorted(calls[w].items())) or "none")
                     for w in worst)
    metrics = {"key_figure": f"{port[0].wrapper} vs DDP: peak {_mib(worst[port[0].wrapper])} vs "
                             f"{_mib(worst[ddp[0].wrapper])}, {steps[port[0].wrapper] * 1e3:.1f} vs "
                             f"{steps[ddp[0].wrapper] * 1e3:.1f} ms/step",
               MIGRATION: rows, "hazards": len(said)}
    evidence: dict[str, Any] = {MIGRATION: {"rows": rows, "hazards": said, "parted": parted,
                                            "steps": STEPS, "param_rtol": PARAM_RTOL}}
    if said:
        evidence[WARNINGS] = said
    if parted:
        return Outcome.failed(
            f"after {WARMUP + STEPS} steps from the same weights, {len(parted)} parameter(s) differ between DDP "
            f"and {port[0].wrapper} beyond {PARAM_RTOL:g} relative ({', '.join(parted[:4])}): {side}",
            metrics=metrics, evidence=evidence,
            recommendation="run gradient-equivalence on both (--compare-ddp): it names which way departs from the "
                           "single-process step, and why")
    return Outcome.passed(
        f"DDP and {port[0].wrapper} side by side on {ctx.world_size} ranks over {STEPS} measured steps "
        f"(parameters after {WARMUP + STEPS} steps agree within {PARAM_RTOL:g}): {side}"
        + (f"; {len(said)} hazard(s) of the port: " + " | ".join(said) if said else "; no hazard found"),
        metrics=metrics, evidence=evidence)

