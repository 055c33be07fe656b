"""Rank-side helpers shared by the conformance checks: one training run, recorded.

Every equivalence check is the same experiment with different knobs: build the target's model
from a fixed seed, wrap it in DDP with the target's ``ddp_kwargs``, feed each rank its
contiguous shard of the global batch (DESIGN.md 3.2) as K microbatches, run the target's own
``train_step`` and record gradients and parameters. The single-process reference is the *same
function* run in a 1-rank world with the whole global batch, so nothing about "what a step
should do" is re-implemented here.

Functions that a World runs (``run_recorded``) are module-level so that they pickle by
reference into the spawned rank processes; they return CPU tensors and plain Python only.
"""

from __future__ import annotations

import contextlib
import hashlib
from dataclasses import dataclass, field
from typing import Any, Iterator

SEED = 1234  # the suite seeds torch with this before every build_model()

# DDP constructor arguments that cannot travel to a rank or would bypass the suite's own
# process group; the target's value is ignored (and reported) rather than crashing a rank.
_NOT_FORWARDED = ("process_group",)


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
    seed: int = SEED
    ddp_overrides: dict[str, Any] = field(default_factory=dict)
    count_allreduce: bool = False
    record_all_ranks: bool = True

    def __post_init__(self) -> None:
        if self.steps < 1 or self.microbatches < 1 or self.global_batch < 1:
            raise ValueError(f"steps={self.steps}, microbatches={self.microbatches} and "
                             f"global_batch={self.global_batch} must all be >= 1")


# -- building blocks (usable in any rank function) ------------------------------------------


def disable_tf32() -> None:
    """Equivalence checks compare fp32 to fp32: TF32 matmuls (10-bit mantissa) would differ by
    ~1e-3 between the N-rank and the reference runs for reasons that have nothing to do with DDP."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def build_model(target: Any, device: Any, *, seed: int = SEED) -> Any:
    """The target's model, seeded exactly as the suite promises (DESIGN.md 3.2), on ``device``."""
    import torch

    from ..targets import build_model_checked

    torch.manual_seed(seed)
    return build_model_checked(target).to(device)


def effective_ddp_kwargs(target: Any, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    kwargs = {k: v for k, v in target.ddp_kwargs.items() if k not in _NOT_FORWARDED}
    kwargs.update(overrides or {})
    if kwargs.get("static_graph"):
        # static_graph replaces the unused-parameter search; asking for both is contradictory.
        kwargs.pop("find_unused_parameters", None)
    return kwargs


def wrap(model: Any, device: Any, kwargs: dict[str, Any]) -> Any:
    """DDP around ``model`` as production wraps it. Construction broadcasts rank 0's parameters
    and buffers to every rank: it is a collective, so every rank must reach this line."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    device_ids = [device.index] if getattr(device, "type", "cpu") == "cuda" else None
    return DDP(model, device_ids=device_ids, **kwargs)


def global_batch(target: Any, step: int, batch_size: int, *, seed: int = SEED) -> tuple[Any, Any]:
    """The global batch of ``step``: make_batch with a generator seeded ``seed + step``, so
    every rank and the reference draw the very same samples without communicating."""
    import torch

    from ..targets import make_batch_checked

    return make_batch_checked(target, torch.Generator().manual_seed(seed + step), batch_size)


def shard(batch: tuple[Any, Any], rank: int, world_size: int,
          microbatches: int) -> list[tuple[Any, Any]]:
    """Rank r's contiguous rows [r·B/N, (r+1)·B/N), split into K contiguous microbatches.

    At world size 1 with K = N·K' this yields exactly the N-rank run's microbatches, in rank
    order: the reference sees the same samples grouped the same way.
    """
    inputs, targets = batch
    size = inputs.shape[0]
    if size % (world_size * microbatches):
        raise ValueError(f"global batch {size} is not divisible by world_size={world_size} x "
                         f"microbatches={microbatches}")
    per_rank = size // world_size
    per_micro = per_rank // microbatches
    start = rank * per_rank
    return [(inputs[start + i * per_micro:start + (i + 1) * per_micro],
             targets[start + i * per_micro:start + (i + 1) * per_micro])
            for i in range(microbatches)]


def to_device(batches: list[tuple[Any, Any]], device: Any) -> list[tuple[Any, Any]]:
    return [(x.to(device), y.to(device)) for x, y in batches]


def unwrap(model: Any) -> Any:
    return getattr(model, "module", model)


def param_state(model: Any) -> dict[str, Any]:
    """Parameters by name as CPU fp copies (deduplicated: a tied weight appears once)."""
    return {name: p.detach().cpu().clone() for name, p in unwrap(model).named_parameters()}


def grad_state(model: Any) -> dict[str, Any]:
    """Gradients by parameter name (None where the parameter has none) as CPU copies."""
    return {name: None if p.grad is None else p.grad.detach().cpu().clone()
            for name, p in unwrap(model).named_parameters()}


def tensor_digest(tensor: Any) -> str:
    """Exact identity of a tensor's values (dtype and shape included): equal digests mean
    bit-identical tensors, which is what DDP promises for parameters across ranks."""
    import torch

    t = tensor.detach().cpu().contiguous()
    h = hashlib.sha1(f"{t.dtype}{tuple(t.shape)}".encode())
    if t.numel():
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def has_local_batchnorm(model: Any) -> bool:
    """True when the model normalises with per-batch statistics that DDP does *not* sync.

    Plain BatchNorm under DDP normalises each rank's microbatch by its own statistics
    (SyncBatchNorm is the documented fix), so the N-rank step equals the single-process step
    on the same microbatches, not on one big batch. The reference then runs the global batch
    as N·K microbatches of the same rows.
    """
    from torch import nn

    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) and not isinstance(m, nn.SyncBatchNorm)
               and m.training for m in unwrap(model).modules())


@contextlib.contextmanager
def counting_allreduce(ddp_model: Any) -> Iterator[dict[str, int]]:
    """Count bucket all-reduces with a comm hook that wraps the stock ``allreduce_hook``.

    A comm hook is called once per *bucket* whose gradients are ready in a synchronising
    backward; ``bucket.is_last()`` marks the end of one synchronisation round. Rounds per
    optimizer step is the quantity the no_sync contract fixes at 1 per K microbatches.
    The hook must be registered before the first backward (DDP refuses it afterwards).
    """
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    counts: dict[str, Any] = {"calls": 0, "rounds": 0, "indices": set()}

    # Deliberately unannotated: DDP inspects the hook's signature and rejects a ``bucket``
    # annotation other than dist.GradBucket (and postponed annotations are strings).
    def hook(state, bucket):  # type: ignore[no-untyped-def]
        counts["calls"] += 1
        counts["indices"].add(bucket.index())
        if bucket.is_last():
            counts["rounds"] += 1
        # The stock hook divides by the world size then all-reduces: same mean as DDP's
        # built-in path, a different (equally valid) summation order.
        return default_hooks.allreduce_hook(state, bucket)

    ddp_model.register_comm_hook(state=None, hook=hook)
    yield counts


# -- the recorded run (a World work function) -----------------------------------------------


def run_recorded(rank_ctx: Any, plan: RunPlan, initial: dict[str, Any] | None = None) -> dict[str, Any]:
    """Run ``plan.steps`` steps of the target's ``train_step`` under DDP on this rank.

    Returns (rank 0 always, other ranks when ``plan.record_all_ranks``): ``initial`` (the
    parameters and buffers after DDP's broadcast, to seed the reference), ``grads0`` (the
    gradients ``train_step`` left after step 0: synchronised, before any later step),
    ``params`` (parameters after every step), and all-reduce counts per step when asked.
    ``initial`` given: load it before wrapping (the reference starts where rank 0 started).
    """
    from ..targets import load_target

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
            batch = global_batch(target, step, plan.global_batch, seed=plan.seed)
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
