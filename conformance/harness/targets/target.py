"""A loaded target (``Target``) and what the supervisor may know of it (``TargetInfo``).

The names a target defines are the public contract written down in the README section
'Writing a target'; the constants below are the names and settings the loader accepts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable

from .calls import TargetCalls, default_build_optimizer, default_train_step
from .errors import SEE, TargetError

BUILTINS = ("mlp", "tied-lm", "branchy", "convbn", "trainer")
REQUIRED = ("build_model", "make_batch")  # and loss_fn, unless forward_loss is defined
OPTIONAL_CALLABLES = ("loss_fn", "forward_loss", "build_optimizer", "train_step", "epoch_batches",
                      "run_loop", "configure_ddp", "evaluate", "parallelize")
#: ``sampling``: how the target draws its training samples. "epochs": a sampler that visits every
#: sample once per epoch (DistributedSampler), which sampler-coverage verifies through
#: ``epoch_batches``; "with-replacement": random draws (e.g. random windows of a token stream),
#: where there is no epoch to cover; "repeated": repeated augmentation (DeiT's RASampler), each
#: sample drawn ``sampling_repeats`` times per epoch by design.
SAMPLING_MODES = ("epochs", "with-replacement", "repeated")
#: ``sample_identity``: what ``epoch_batches`` yields per batch. "content": the batch itself
#: (samples told apart by a hash of their input rows); "index": the batch's sample indices
#: (a list of ints or a 1-D integer tensor), so repeated content in the dataset is never
#: mistaken for a duplicate.
SAMPLE_IDENTITIES = ("content", "index")
# DDP constructor arguments a target may set; anything else is a typo that DDP would reject
# only later, inside a rank process, with a less helpful message.
DDP_KWARGS = ("find_unused_parameters", "bucket_cap_mb", "static_graph", "gradient_as_bucket_view",
              "broadcast_buffers", "forward_sync_buffers", "init_sync", "check_reduction",
              "process_group", "mixed_precision")


@dataclass(frozen=True)
class Target(TargetCalls):
    """A loaded target. ``spec`` is what rank processes pass to load_target to get it back."""

    name: str
    spec: str
    module: ModuleType
    build_model: Callable[[], Any]
    make_batch: Callable[[Any, int], Any]
    loss_fn: Callable[[Any, Any], Any] | None = None
    forward_loss: Callable[[Any, Any], Any] | None = None
    build_optimizer: Callable[[Any], Any] = default_build_optimizer
    train_step: Callable[..., None] = default_train_step
    ddp_kwargs: dict[str, Any] = field(default_factory=dict)
    epoch_batches: Callable[[int, int, int], Any] | None = None
    run_loop: Callable[[Any], None] | None = None
    # Called on every DDP model right after construction (ddp.configure): comm hooks, DDP state.
    configure_ddp: Callable[[Any], Any] | None = None
    # The target's own distributed evaluation: evaluate(model, ctx) -> {metric: value} (eval-equivalence).
    evaluate: Callable[[Any, Any], Any] | None = None
    # Applied instead of DDP wherever the suite wraps (harness.parallel): fully_shard, replicate.
    parallelize: Callable[[Any, Any], Any] | None = None
    builtin: bool = False
    global_batch_size: int | None = None  # optional extension: the production global batch
    sampling: str = "epochs"  # one of SAMPLING_MODES
    #: With ``sampling = "repeated"``: how many times each sample is drawn per epoch (r >= 2).
    sampling_repeats: int | None = None
    sample_identity: str = "content"  # one of SAMPLE_IDENTITIES
    # Where make_batch's tensors hold the batch (harness.batches): None is dim 0 everywhere.
    batch_dim: Any = None
    # Where the user's code lives, for telling their exceptions from DDP's (target_calls.blame).
    user_files: frozenset[str] = frozenset()
    user_dir: str | None = None
    # torch's default generator state right after the import, where the import seeded torch
    # itself (``torch.manual_seed`` at module level); None where it did not: what a torchrun
    # worker's data pipeline starts from (``checks/sampling/pipeline.production_rng``).
    import_rng_state: Any = None

    def batch_size_for(self, world_size: int, microbatches: int = 1) -> int:
        """The global batch a check uses (:func:`global_batch_for`)."""
        return global_batch_for(self.name, self.global_batch_size, world_size, microbatches)

    def info(self) -> TargetInfo:
        """What the supervisor may know of this target: names and settings, none of its code."""
        return TargetInfo(name=self.name, spec=self.spec, builtin=self.builtin,
                          defines=frozenset(a for a in OPTIONAL_CALLABLES
                                            if getattr(self, a) is not None and not _is_default(self, a)),
                          ddp_kwargs={k: _plain(v) for k, v in self.ddp_kwargs.items()},
                          global_batch_size=self.global_batch_size, sampling=self.sampling,
                          sample_identity=self.sample_identity, sampling_repeats=self.sampling_repeats)


def global_batch_for(name: str, global_batch_size: int | None, world_size: int,
                     microbatches: int = 1) -> int:
    """The global batch a check uses: the target's own, or 4 samples per microbatch per rank.

    Raises TargetError when the target's batch cannot be split evenly (the README section
    'Writing a target': it is split into world_size contiguous chunks, each into K
    microbatches).
    """
    unit = world_size * microbatches
    if global_batch_size is None:
        return 4 * unit
    if global_batch_size % unit:
        raise TargetError(f"target {name!r}: global_batch_size={global_batch_size} is "
                          f"not divisible by world_size={world_size} x microbatches={microbatches}; "
                          f"use a multiple of {unit} ({SEE})")
    return global_batch_size


def _is_default(target: Target, attr: str) -> bool:
    return (attr, getattr(target, attr)) in (("build_optimizer", default_build_optimizer),
                                             ("train_step", default_train_step))


def _plain(value: Any) -> Any:
    """A ddp_kwargs value as the supervisor sees it: JSON's plain values as they are, anything
    else (a MixedPrecision, a process group) as its repr."""
    return value if value is None or isinstance(value, (bool, int, float, str)) else repr(value)


@dataclass(frozen=True)
class TargetInfo:
    """A target as the supervisor knows it: its names and settings, never its code.

    The supervisor (the CLI's process, the pytest controller) never imports the user's code:
    an import can exit the process, start threads and processes, install signal handlers or
    change the working directory. A child process loads the target and sends this back as
    JSON (``conformance/harness/world/validate.py``); ranks load the target itself by ``spec``.
    """

    name: str
    spec: str
    builtin: bool = False
    #: The optional functions the target defines (OPTIONAL_CALLABLES), not the suite's defaults.
    defines: frozenset[str] = frozenset()
    ddp_kwargs: dict[str, Any] = field(default_factory=dict)
    global_batch_size: int | None = None
    sampling: str = SAMPLING_MODES[0]
    sample_identity: str = SAMPLE_IDENTITIES[0]
    sampling_repeats: int | None = None

    def has(self, attr: str) -> bool:
        """True when the target defines the optional function ``attr`` (e.g. ``run_loop``)."""
        return attr in self.defines

    def batch_size_for(self, world_size: int, microbatches: int = 1) -> int:
        """The global batch a check uses (:func:`global_batch_for`)."""
        return global_batch_for(self.name, self.global_batch_size, world_size, microbatches)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "spec": self.spec, "builtin": self.builtin,
                "defines": sorted(self.defines), "ddp_kwargs": self.ddp_kwargs,
                "global_batch_size": self.global_batch_size, "sampling": self.sampling,
                "sample_identity": self.sample_identity, "sampling_repeats": self.sampling_repeats}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TargetInfo:
        return cls(name=str(data["name"]), spec=str(data["spec"]), builtin=bool(data["builtin"]),
                   defines=frozenset(data["defines"]), ddp_kwargs=dict(data["ddp_kwargs"]),
                   global_batch_size=data["global_batch_size"], sampling=str(data["sampling"]),
                   sample_identity=str(data["sample_identity"]), sampling_repeats=data.get("sampling_repeats"))
