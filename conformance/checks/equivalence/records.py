"""What one rank returns from a recorded run: typed slices, one per probe.

Every rank-side observer of the recorded step is a probe (``harness.observe.Probe``): it
attaches itself to the model, the optimizer or the torch functions the step goes through,
observes each step and returns its own slice of the rank's record; ``recording.run_recorded``
hands them to one ``Observation``, and nothing outside a probe reads or sets its internals.
The bucket all-reduces and the forwards are the shared probes' (``AllReduceSlice``,
``ForwardCountSlice``); the rest are this engine's own. Every slice is plain Python
(summaries, never a tensor): it crosses the world's pipe to the supervisor.
"""

from __future__ import annotations

from typing import Any, TypedDict

from ...harness.observe import AllReduceSlice, ForwardCountSlice, StepCollectivesSlice, SyncFlagSlice
from .batch_layout import LayoutSlice
from .start_loss import StartLoss
from .tensors import Compared

#: (what was digested, [(tensor name, digest or None)]): ``digests``.
Digested = tuple[str, list[tuple[str, str | None]]]


class _MeasuredSplit(TypedDict):
    """The loss of the whole global batch against its equal microbatches' (``loss_split``): the
    target's own loss, at the initial weights, dropout off; forwards, and a backward through
    the loss alone."""

    whole: float
    parts_mean: float
    parts: int  # the number of equal microbatches (the N-rank run's N·K)
    rel_gap: float  # |whole - parts_mean| / |whole|
    # |Σ|∂L/∂out|² - Σ_i |∂L_i/∂out_i / parts|²| / Σ|∂L/∂out|² (None: no floating output)
    grad_gap: float | None
    half: list[str]  # half-precision dtypes seen in forward (autocast): the noisier threshold
    threshold: float  # the largest rel_gap / grad_gap that still counts as a mean over samples


class LossSplit(_MeasuredSplit, total=False):
    """``_MeasuredSplit``, and where the model's own outputs for a sample already differed
    between the whole batch and its parts (``mixing.Mixing.to_json``; absent: nowhere), and the
    smallest and largest of the parts' losses (a weighting of per-sample terms keeps the whole
    between them: ``hypotheses.batch_term``)."""

    mixing: dict[str, Any]
    parts_min: float
    parts_max: float


class SetupSlice(LayoutSlice, total=False):
    """How the run was set up on this rank (``recording.prepare``); with which rows of each
    BatchNorm's and top-k call's input are which samples (``batch_layout.LayoutSlice``)."""

    rank: int
    ddp_kwargs: str  # repr of the effective DDP constructor arguments
    wrapper: str  # what trained the model (``harness.parallel.wrapper_of``): DDP, fully_shard, ...
    comm_hook: dict[str, Any] | None  # the target's comm hook (``compression.comm_hook_of``)
    dropout_disabled: list[str]
    rng_in_forward: bool
    batchnorm_grouped: list[str]
    batchnorm_group: int | None
    batchnorm_sizes_seen: list[int]
    # BatchNorm modules whose forward called a collective: synchronised, never grouped.
    batchnorm_synchronised: list[str]
    # nn.SyncBatchNorm modules run as the suite's CPU implementation (``harness.sync_batchnorm``).
    sync_batchnorm_substituted: list[str]
    # The floor's twin only: does the loss decompose as a mean over samples (``hypotheses``)?
    loss_split: LossSplit
    # One microbatch per rank only: the loss at the initial weights (``start_loss``).
    start_loss: StartLoss
    # Compare role only: the first tensor whose initial value differed from the reference's
    # build (then copied in), and how this rank compared (``digests.REFERENCE`` | ``DIGEST``).
    initial_differs_from_reference: str | None
    compared_by: str


class DataSlice(TypedDict):
    """Per step: the digest of the global batch this rank drew."""

    batch_digests: list[str]


class RoutingSlice(TypedDict):
    """Per step: the top-k indices the forward chose (None: too many to record)."""

    routing: list[Any]


class CompileSlice(TypedDict):
    """What torch.compile did on this rank (None: the target compiles nothing)."""

    compile: dict[str, Any] | None


class FeaturesSlice(TypedDict):
    """The production features the step used (``harness.features``)."""

    features: dict[str, dict[str, Any]]


class ClipSlice(TypedDict):
    """Per step: what each ``clip_grad_norm_`` call measured (``total_norm``, ``max_norm``)."""

    clip_calls: list[list[dict[str, float]]]


class ShardFactor(TypedDict):
    """One rank's local gradient shards (FSDP2) against the same slices of the reference's
    gradients (``shards.shard_factor``): ``factor`` = <got, ref> / |ref|², ``residual`` =
    |got - factor·ref| / |got|."""

    factor: float
    residual: float
    tensors: int


class GradientSlice(TypedDict, total=False):
    """What the optimizer consumed, compared (or written, by the reference): per step the
    ``optimizer.step()`` calls; the gradients at the first step
    that ran (``grads0``, at ``grads0_step``) and before its clipping (``pre_clip0``): the
    ranks' per-tensor comparisons, the reference's norms; the parameters after every step;
    the first NaN/Inf; digests where some rank cannot read the reference's files."""

    optimizer_steps: list[int]
    grads0: list[Compared] | dict[str, float | None] | None
    grads0_step: int | None
    pre_clip0: list[Compared] | dict[str, float | None] | None
    params: list[list[Compared]]
    digests: list[Digested]
    nonfinite: dict[str, Any] | None
    #: Steps whose train_step changed the parameters with no optimizer step (a hand-written
    #: update): judged on what it left in ``.grad`` and the parameters after it.
    manual_update: list[int]
    #: FSDP2: this rank's gradient shards against the same slices of the reference, when the
    #: full gradients differ (``shards``; None: not sharded, or nothing differed).
    shard_factor: ShardFactor | None
    #: Per step, at its first optimizer.step(): each parameter's gradient norm (None: no step)
    #: and the largest change an adaptive optimizer's update could make (None: not adaptive).
    grad_norms: list[dict[str, float | None] | None]
    update_bounds: list[float | None]
    #: Per step, each param group's learning rate at its first optimizer.step() (None: no step).
    learning_rates: list[list[float] | None]


class RankRecord(SetupSlice, AllReduceSlice, ForwardCountSlice, SyncFlagSlice, DataSlice, RoutingSlice, CompileSlice,
                 FeaturesSlice, ClipSlice, GradientSlice, StepCollectivesSlice, total=False):
    """One rank's record of a recorded run: the union of its probes' slices."""
