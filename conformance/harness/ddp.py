"""The one rank-side DDP module: seeds, building and wrapping, device sync, what DDP did.

Every check family (conformance checks, perf, faults) builds its rank-side experiments from
these pieces, so "how the suite builds a model", "which rows rank r gets" and "what DDP
reported about its buckets" have one answer each. Functions here run inside rank processes
(World work functions call them); they import torch lazily so that importing this module
stays cheap for the supervisor. Which rows of a batch rank r gets: ``harness.sharding``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .sync_batchnorm import substitute

# -- seeds --------------------------------------------------------------------------------
# Named, because two sides of one experiment must agree on them by value: an N-rank run and
# its single-process reference, or a scenario and the check that re-creates its data.

#: ``torch.manual_seed`` before every ``build_model()`` in the equivalence checks, and the base
#: of their data: the global batch of step s is drawn with a generator seeded ``MODEL_SEED + s``.
MODEL_SEED = 1234
#: Model and data seed of the measurement probes (perf profiles, chaos vehicles): any fixed
#: value works there, nothing compares against another run's values.
PROBE_SEED = 0
#: Data seeds of the chaos experiments, one range per family so their batches never coincide
#: by accident: step s of a hang scenario draws ``SCENARIO_DATA_SEED + s``, and so on.
SCENARIO_DATA_SEED = 1000
STRAGGLER_DATA_SEED = 5000
BUCKET_SWEEP_DATA_SEED = 7000
BUCKET_MISMATCH_DATA_SEED = 9000

# DDP constructor arguments that cannot travel to a rank or would bypass the suite's own
# process group; the target's value is ignored (and reported) rather than crashing a rank.
_NOT_FORWARDED = ("process_group",)

#: Fields of ``DDP._get_ddp_logging_data()`` the suite reads (timings in ns, bucket layout).
LOGGING_KEYS = ("avg_forward_compute_time", "avg_backward_compute_time", "avg_backward_comm_time",
                "avg_backward_compute_comm_overlap_time", "rebuilt_bucket_sizes",
                "rebuilt_per_bucket_param_indices", "bucket_sizes", "bucket_cap_bytes", "iteration",
                "backend_name", "find_unused_parameters", "static_graph", "gradient_as_bucket_view")
_TIMING_KEYS = LOGGING_KEYS[:4]


# -- numerics and the device --------------------------------------------------------------


def disable_tf32() -> None:
    """Equivalence checks compare fp32 to fp32: TF32 matmuls (10-bit mantissa) would differ by
    ~1e-3 between the N-rank and the reference runs for reasons that have nothing to do with DDP."""
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def disable_dropout(model: Any) -> list[str]:
    """Set every dropout probability in ``model`` to 0; the names of what was changed (the
    equivalence checks' and resume-equivalence's rule: conformance/checks/equivalence/randomness.py)."""
    from torch import nn

    changed = []
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.dropout._DropoutNd):
            if module.p > 0:
                module.p = 0.0
                changed.append(name or type(module).__name__)
            continue
        rate = getattr(module, "dropout", None)
        if isinstance(rate, float) and not isinstance(rate, bool) and rate > 0:
            module.dropout = 0.0
            changed.append(f"{name}.dropout" if name else "dropout")
    return changed


def sync_device(device: Any) -> None:
    """Wait for the device to be idle. Kernels run asynchronously: a wall-clock reading is only
    meaningful after this (a no-op on CPU)."""
    if getattr(device, "type", "cpu") == "cuda":
        import torch

        torch.cuda.synchronize(device)


def debug_info_on() -> None:
    """Re-read TORCH_DISTRIBUTED_DEBUG before building DDP.

    c10d reads the variable once, when torch.distributed is first imported; a rank that
    imported torch before the world set ``TORCH_DISTRIBUTED_DEBUG=INFO`` would otherwise build
    DDP at level OFF, and DDP's unused-parameter error would give indices instead of names
    (measured on torch 2.13). Never DETAIL: it segfaults DDP construction with gloo.
    """
    import torch.distributed as dist

    if os.environ.get("TORCH_DISTRIBUTED_DEBUG", "").upper() != "DETAIL":
        dist.set_debug_level_from_env()


# -- the model ----------------------------------------------------------------------------


def build_model(target: Any, device: Any, *, seed: int = MODEL_SEED) -> Any:
    """The target's model, seeded as the suite promises, on ``device`` (on a CPU, its
    ``nn.SyncBatchNorm`` as the same maths on gloo: ``sync_batchnorm``).

    A loaded :class:`~conformance.harness.targets.Target` is built through its checked
    constructor (a failure is a TargetError); a chaos vehicle is built directly.
    """
    import torch

    from .targets.loading import build_model_checked
    from .targets.target import Target

    torch.manual_seed(seed)
    model = build_model_checked(target) if isinstance(target, Target) else target.build_model()
    # Before any forward: nn.SyncBatchNorm raises on CPU once a process group exists.
    substitute(model, device)
    return model.to(device)


def effective_ddp_kwargs(target: Any, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The target's ``ddp_kwargs`` as the suite applies them, with ``overrides`` on top."""
    kwargs = {k: v for k, v in target.ddp_kwargs.items() if k not in _NOT_FORWARDED}
    kwargs.update(overrides or {})
    if kwargs.get("static_graph"):
        # static_graph replaces the unused-parameter search; asking for both is contradictory.
        kwargs.pop("find_unused_parameters", None)
    return kwargs


def wrap(model: Any, device: Any, kwargs: dict[str, Any], *, target: Any = None,
         via_ddp: bool = False) -> Any:
    """DDP around ``model`` on ``device`` with exactly ``kwargs`` (a ``process_group`` included),
    then the target's ``configure_ddp`` on it when ``target`` defines one (:func:`configure`);
    or, when ``target`` defines ``parallelize`` (and ``via_ddp`` is False), what that returned
    (``harness.parallel``: fully_shard, replicate), ``kwargs`` unused.

    Construction broadcasts rank 0's parameters and buffers to every rank: it is a collective,
    so every rank of the group must reach this line. Returns what the step trains: the DDP
    model, or the module around it that ``configure_ddp`` returned (``comm_hooks.ddp_of`` gets
    the DDP object back for the suite's instrumentation).
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    if target is not None and getattr(target, "parallelize", None) is not None and not via_ddp:
        import torch.distributed as dist

        from .parallel import parallelize

        # The target's own wrapper replaces DDP everywhere (its ddp_kwargs then serve only
        # the --compare-ddp run, ``via_ddp``); fully_shard/replicate construction is
        # collective, as DDP's broadcast is: every rank reaches this line.
        return parallelize(target, model, device, dist.get_rank(), dist.get_world_size())
    debug_info_on()
    model = model.to(device)
    substitute(model, device)  # DDP refuses nn.SyncBatchNorm in a CPU module
    device_ids = [device.index] if getattr(device, "type", "cpu") == "cuda" else None
    ddp = DDP(model, device_ids=device_ids, **kwargs)
    return ddp if target is None else configure(target, ddp)


def configure(target: Any, ddp: Any) -> Any:
    """The target's ``configure_ddp(ddp_model)``, right after construction; the model to train
    is returned (README section "Writing a target").

    A comm hook it registers is captured and becomes the innermost reduce of the model's one
    hook chain (``comm_hooks``), so the suite's counting and recording hooks compose with it
    instead of failing "... can only be called once". It may return None or the model it got
    (the DDP model is trained), or a module around that very model, such as
    ``torch.compile(ddp_model)`` (that module is trained: train_step gets it, the suite's hooks
    and DDP's logging data still go to the DDP model inside). Anything else, and an exception of
    the user's own code in it, is a TargetError (exit 2, ``file:line``).
    """
    fn = getattr(target, "configure_ddp", None)
    if fn is None:
        return ddp
    from .comm_hooks import capturing, ddp_of, install_user_hook
    from .target_calls import defined_at
    from .targets.errors import SEE, TargetError, call_target

    name = getattr(target, "name", "?")

    def refuse(message: str) -> TargetError:
        return TargetError(f"target {name!r}: configure_ddp (defined at {defined_at(fn)}): "
                           f"{message}; register one comm hook ({SEE})")

    with capturing(ddp, refuse=refuse) as captured:
        returned = call_target(target, "configure_ddp", fn, ddp)
    if captured:
        install_user_hook(ddp, captured[0])
    if returned is None or returned is ddp:
        return ddp
    if ddp_of(returned) is not ddp:
        raise TargetError(f"target {name!r}: configure_ddp (defined at {defined_at(fn)}) returned a "
                          f"{type(returned).__name__}, not the DDP model it was given nor a module "
                          f"around it; return nothing, ddp_model, or torch.compile(ddp_model) ({SEE})")
    return returned


def unwrap(model: Any) -> Any:
    return getattr(model, "module", model)


def has_local_batchnorm(model: Any) -> bool:
    """True when the model normalises with per-batch statistics that DDP does *not* sync.

    Plain BatchNorm under DDP normalises each rank's microbatch by its own statistics
    (SyncBatchNorm is the documented fix), so the N-rank step equals the single-process step
    on the same microbatches, not on one big batch.
    """
    from torch import nn

    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) and not isinstance(m, nn.SyncBatchNorm)
               and m.training for m in unwrap(model).modules())


# -- what DDP did -------------------------------------------------------------------------


def param_state(model: Any) -> dict[str, Any]:
    """Parameters by name as CPU copies (deduplicated: a tied weight appears once)."""
    return {name: p.detach().cpu().clone() for name, p in unwrap(model).named_parameters()}


def grad_state(model: Any) -> dict[str, Any]:
    """Gradients by parameter name (None where the parameter has none) as CPU copies."""
    return {name: None if p.grad is None else p.grad.detach().cpu().clone()
            for name, p in unwrap(model).named_parameters()}


def tensor_digest(tensor: Any) -> str:
    """Exact identity of a tensor's values (dtype and shape included): equal digests mean
    bit-identical tensors, which is what DDP promises for parameters across ranks. The suite's
    one digest (``digest.py``), taken where the tensor lives: a model's parameters are not
    copied to the host to be digested. An FSDP2 DTensor is digested as ``parallel.comparable``
    has it (a sharded one gathered: a collective)."""
    from .digest import digest
    from .parallel import comparable

    return digest(comparable(tensor.detach()))


def logging_data(ddp_model: Any) -> dict[str, Any]:
    """The fields of DDP's own logging data that the suite reads (see ``LOGGING_KEYS``)."""
    data = ddp_model._get_ddp_logging_data()
    return {k: data[k] for k in LOGGING_KEYS if k in data}


def bucket_count(ddp_model: Any) -> int:
    """How many buckets DDP reduces per step (rebuilt layout, else the initial one)."""
    data = ddp_model._get_ddp_logging_data()
    for key in ("rebuilt_bucket_sizes", "bucket_sizes"):
        raw = str(data.get(key) or "").strip()
        if raw:
            return len([s for s in raw.split(",") if s.strip()])
    return int(data.get("num_buckets_reduced") or 0)


def bucket_layout(ddp_model: Any) -> str:
    """DDP's rebuilt bucket layout: the parameter indices of each bucket, in order ("" until
    DDP logged its rebuild, at the third step's forward). Two wraps of one model with the same
    layout issue the same all-reduces."""
    return str(ddp_model._get_ddp_logging_data().get("rebuilt_per_bucket_param_indices") or "").strip()


def ddp_timing(ddp_model: Any) -> dict[str, float]:
    """DDP's own sampled averages in seconds (gloo on CPU fills these in too, torch 2.13);
    empty for a model DDP does not wrap (``parallelize``: FSDP2 keeps no such averages)."""
    if not hasattr(ddp_model, "_get_ddp_logging_data"):
        return {}
    data = ddp_model._get_ddp_logging_data()
    return {k: float(data.get(k) or 0) / 1e9 for k in _TIMING_KEYS}


# -- the run_loop context -----------------------------------------------------------------

#: ``ctx.checkpoint_every`` unless a check sets it: a save every 2 optimizer steps.
CHECKPOINT_EVERY = 2


@dataclass
class LoopContext:
    """What a target's ``run_loop(ctx)`` receives (README, "Writing a target")."""

    rank: int
    world_size: int
    device: Any
    steps: int
    tmpdir: Path
    ddp_kwargs: dict[str, Any] = field(default_factory=dict)
    on_wrap: Callable[[Any], Any] | None = None  # instrumentation (the collective tracker)
    models: list[Any] = field(default_factory=list)
    #: The target whose ``configure_ddp`` runs on every model wrapped here (None: none runs).
    target: Any = None
    #: One folder every rank sees, the same across a restart, empty at the first start: where
    #: the loop saves its checkpoints and resumes from (resume-equivalence kills the world and
    #: starts a fresh one on it). None: ``tmpdir/checkpoints`` (created).
    checkpoint_dir: Path | None = None
    #: How often, in optimizer steps, the loop should save (production's own save interval).
    checkpoint_every: int = CHECKPOINT_EVERY
    #: 0 on the first start, 1 after a restart (for the loop's logs: a correct loop does not need it).
    restarts: int = 0
    #: How many epochs the check needs the loop to reach (2 where sampler-coverage watches the
    #: sampler, else 1): a loop driven by epochs runs this many, one driven by steps reaches
    #: them within ``steps`` (which the check sets to ``epochs * steps_per_epoch``).
    epochs: int = 1
    #: The most steps the loop runs in one epoch before it starts the next (a cap it applies),
    #: so an epoch boundary is crossed in a few steps. 0 when built: ``steps`` (no cap then:
    #: an epoch never holds more steps than the whole run).
    steps_per_epoch: int = 0

    def __post_init__(self) -> None:
        if self.steps_per_epoch <= 0:
            self.steps_per_epoch = self.steps
        if self.checkpoint_dir is None:
            self.checkpoint_dir = Path(self.tmpdir) / "checkpoints"
        Path(self.checkpoint_dir).mkdir(parents=True, exist_ok=True)

    def wrap(self, model: Any) -> Any:
        """``model`` wrapped in DDP with the target's ddp_kwargs on this rank's device, then
        configured by its ``configure_ddp`` (what that returned, when it returned a module
        around the DDP model)."""
        trained = wrap(model, self.device, self.ddp_kwargs, target=self.target)
        if self.on_wrap is not None:
            # After configure_ddp: its comm hook is captured first, the tracker's layer then
            # observes the buckets on their way to it.
            self.on_wrap(trained)
        self.models.append(trained)
        return trained
