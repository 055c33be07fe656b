"""One recorded training run of the target: the rank-side experiment of the equivalence checks.

Where the comparison happens: the single-process reference runs *first* and writes its snapshots
(initial weights, first-step gradients, parameters after every step) to files in the check's private
temp dir, one tensor at a time (``snapshots``); the N-rank ranks then compare their own live tensors
against those files, tensor by tensor, on their device, at the very moment the optimizer consumes
them, and return summaries only. This way round (rather than ranks writing and the reference
comparing) the disk holds one copy of the model per snapshot instead of N, the N comparisons run in
parallel on the ranks' devices, and no rank ever keeps a copy of its gradients or parameters: its
memory overhead is the one reference tensor being compared. Initial weights: the reference builds
from the same seed; rank 0, before wrapping, checks its weights bit for bit against the reference's
initial snapshot and copies the reference's in where a non-deterministic ``build_model`` made them
differ (recorded); DDP's construction broadcast carries them to every rank (and every other rank
that can read the files checks again after it: rank-local buffers), so both runs start from exactly
the same weights either way.

A rank that cannot see the files (``--attach`` across hosts: the reference ran on rank 0's host)
digests the same tensors at the same points instead, and so does every rank that compares (only
in such a run), for the judge to carry the comparison over by bit identity (``digests``).

Build the target's model from the suite's seed, wrap it in DDP with the target's
``ddp_kwargs``, feed each rank its contiguous shard of the global batch as K microbatches, run
the target's own ``train_step`` and record what the optimizer consumed. The single-process
reference is the *same function* run in a 1-rank world with the whole global batch, so nothing
about "what a step should do" is re-implemented here.

Recorded per step (see ``instruments``): the gradients at the first ``optimizer.step()`` (a step
pre-hook: ``zero_grad`` before or after the step, ``set_to_none`` or not, all read the same), how
many optimizer steps, forwards through DDP and through the inner module, all-reduce calls and rounds
(a counting comm hook), what ``clip_grad_norm_`` measured and the gradients before it clipped them,
and the first NaN/Inf (forward output, gradient, parameter). Before the run, dropout is switched off
and BatchNorm normalises in fixed groups on both sides (``randomness``, ``normalisation``): recorded.

``run_recorded`` is module-level so that it pickles by reference into the spawned rank
processes; it returns plain Python and per-tensor summaries only, never a tensor.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

from ...harness.batches import part_dims, take_rows
from ...harness.patching import replaced
from ...harness.ddp import MODEL_SEED
from ...harness.observe import CommRounds, Forwards, Observation, Probe, Slice, Step, StepCollectives, SyncFlags, unseen
from ...harness.parallel import full_named, local, wrapper_of
from ...harness.rank_run import RankRun
from ...harness.sharding import batch_dims, global_batch, shard, to_device
from ...harness.sync_batchnorm import substituted
from ...harness.targets import Target
from ...harness.world import RankContext
from .adaptive import gradient_norms, update_bound
from .batch_layout import LayoutSlice, observe_layouts
from .clipping import PRE_CLIP0, Clipping
from .compiled import output_site, run_eagerly
from .destination import Destination
from .compression import comm_hook_of
from .digests import DIGEST, REFERENCE, named_digests, rank_view, who_sees
from .instruments import (BatchDigests, CompileWatch, Features, Routing, StepRecorder, first_nonfinite,
                          first_nonfinite_of_norms, nonfinite_output)
from .hypotheses import loss_split
from .normalisation import group_batchnorm, sizes_seen, watch_synchronising
from .nudge import nudge
from .randomness import disable_dropout, forward_is_random, state_kept
from .records import GradientSlice, LossSplit, RankRecord, SetupSlice
from .shards import local_slices, shard_factor
from .start_loss import measure_start_loss
from .wide_sums import sum64
from .schedule import learning_rates
from .snapshots import SnapshotWriter, compare_snapshot, has_snapshot, read_snapshot

# Snapshot labels of the reference (``snapshots``): the initial weights, the first step's
# gradients, the gradients before that step's clipping, the parameters after step s.
INITIAL, GRADS0, PARAMS = "initial", "grads0", "params"
ROLES = ("reference", "compare")

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
    # "reference": write snapshots into ``snapshots``; "compare": compare against them there.
    role: str = "compare"
    snapshots: str = ""
    # The reference's memory-backed folder for its snapshots while they fit ("": none; see
    # ``snapshots``); readers find them through ``snapshots`` either way.
    memory: str = ""
    # The target's comm hook (configure_ddp) replaced by the stock all-reduce: the
    # *uncompressed* run a compressing hook's error is measured against (``floor``).
    uncompressed: bool = False
    # Every torch.compile'd region run eagerly (``compiled``): the eager reference of a
    # compiled target, so the N-rank difference is compiled vs eager DDP.
    eager: bool = False
    # The microbatches handed to train_step in reverse order: the same sum in another order
    # (the reordered twin of ``twin``, for a step that joins its microbatches again).
    reverse_microbatches: bool = False
    # Measure whether the loss decomposes as a mean over samples (``hypotheses.loss_split``):
    # the floor's twin, on the global batch and its N·K microbatches, before its first step.
    measure_loss_split: bool = False
    # BatchNorm modules left ungrouped on this side because the other side saw them
    # synchronise (``normalisation``: a look-alike that syncs only in a world of 2 or more).
    ungrouped: tuple[str, ...] = ()
    nudge_ulps: int = 0  # start this many ulps above the reference (``sensitivity``); 0: where it started

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role={self.role!r} must be one of {ROLES}")
        if self.steps < 1 or self.microbatches < 1 or self.global_batch < 1 or self.norm_group < 0:
            raise ValueError(f"steps={self.steps}, microbatches={self.microbatches}, "
                             f"global_batch={self.global_batch} must all be >= 1 and "
                             f"norm_group={self.norm_group} >= 0")


def _verify_initial(inner: Any, snapshots: Path, device: Any, *, buffers_only: bool = False) -> str | None:
    """Make rank 0 start exactly where the reference started (before wrapping: DDP's
    construction broadcast then carries these weights to every rank).

    The reference built the model from the same seed; on a deterministic ``build_model``
    every tensor here is bit-identical to it, which is checked tensor by tensor. Where one
    differs (a build that draws from an unseeded source), the reference's initial parameters
    and buffers are copied in, so both runs still start from the same weights; the first
    differing name is returned for the record. ``buffers_only``: the parameters are left
    alone (after DDP's construction broadcast they are rank 0's, checked there already).
    """
    import torch

    state = inner.state_dict()
    if buffers_only:
        buffers = {name for name, _ in inner.named_buffers()}
        state = {name: t for name, t in state.items() if name in buffers}
        if not state:
            return None
    first = None
    with torch.no_grad():
        for name, ref in read_snapshot(snapshots, INITIAL, device):
            mine = state.get(name)
            if mine is None or ref is None or tuple(mine.shape) != tuple(ref.shape):
                continue
            if not torch.equal(mine, ref.to(mine.dtype)):
                first = first or name
                mine.copy_(ref)
    return first


# -- where the recorded tensors go ----------------------------------------------------------


@dataclass
class Gradients(Probe):
    """What the optimizer consumed (``StepRecorder``'s step pre-hook), recorded where it lives:
    the gradients of the first ``optimizer.step()`` that ran, the parameters after every step,
    and the first NaN/Inf (forward output, gradient, parameter)."""

    ddp: Any
    inner: Any
    optimizer: Any
    to: Destination
    clipping: Clipping
    recorder: StepRecorder | None = None
    step: int = 0
    found: dict[str, Any] = field(default_factory=dict)  # "grads", "grads_digest" at the first step
    bad: str | None = None  # the first non-finite gradient at this step's optimizer.step()
    out: GradientSlice = field(default_factory=lambda: GradientSlice(
        optimizer_steps=[], params=[], digests=[], nonfinite=None, manual_update=[], grad_norms=[],
        update_bounds=[], learning_rates=[]))
    #: The parameters' fingerprint (``_fingerprint``) at this step's start and at each forward
    #: since, taken until an optimizer step is seen: a train_step that changes them with no
    #: optimizer step updates them by hand (``_by_hand``), ``hand_updates`` times so far.
    last: list[str] | None = None
    hand_updates: int = 0
    stepped: bool = False  # some optimizer.step() ran in an earlier step
    # This step's gradient norms and adaptive update bound at its first optimizer.step()
    # (``adaptive``: the later steps' gradients and the parameters' floor under Adam).
    norms: dict[str, float | None] | None = None
    bound: float | None = None
    rates: list[float] | None = None  # this step's learning rates at its first optimizer.step() (``schedule``)

    def attach(self, stack: contextlib.ExitStack) -> None:
        import torch

        self.recorder = StepRecorder.attach(self.inner, self.optimizer, observe=self._at_step)
        stack.callback(self.recorder.close)
        stack.callback(output_site(self.ddp, self.inner).register_forward_hook(unseen(self._watch_output)).remove)
        stack.callback(self.inner.register_forward_pre_hook(unseen(self._at_forward)).remove)
        stack.enter_context(replaced(torch.nn.Module, "zero_grad", self._zeroing))

    def _fingerprint(self) -> list[str] | None:
        """Each parameter's float64 sum, exactly (``float.hex``: a NaN equals itself): changed
        by any update that changes a parameter (a sum left bit-identical by a real update is not
        met in practice), one pass, no copy (``wide_sums``). None once an optimizer step has
        been seen: then nothing is updated by hand."""
        import torch

        assert self.recorder is not None
        if self.stepped or self.recorder.steps:
            return None
        with torch.no_grad():
            # The parameters the optimizer holds (FSDP2 registers unsharded ones during a
            # forward), this rank's shard of each: a fingerprint is only held against itself.
            return [sum64(local(p.detach())).hex() for _, p in self.recorder.params]

    def _zeroing(self, original: Any) -> Any:
        """``Module.zero_grad`` observed: called on the model after its parameters changed by
        hand (``p -= lr * p.grad; model.zero_grad()``, as the PyTorch nn tutorial writes it),
        the gradients it is about to wipe are the ones that update consumed: judged here, as an
        optimizer step pre-hook would."""
        gradients = self

        def zero_grad(module: Any, *args: Any, **kwargs: Any) -> Any:
            if module is gradients.ddp or module is gradients.inner:
                now = gradients._fingerprint()
                if now is not None and gradients.last is not None and now != gradients.last:
                    gradients.hand_updates += 1
                    gradients.last = now
                    gradients._at_step([(name, None if p.grad is None else p.grad.detach())
                                        for name, p in gradients.inner.named_parameters()])
            return original(module, *args, **kwargs)

        return zero_grad

    def _at_forward(self, module: Any, args: Any) -> None:
        # An update by hand between two forwards of one train_step (one per microbatch):
        # counted, so such a step is not mistaken for one that accumulates. Not inside a
        # compiled forward: traced, the hook would be a graph break of the suite's own (a
        # compiled step's updates are counted at zero_grad and at its end only).
        import torch

        if torch.compiler.is_compiling():
            return
        now = self._fingerprint()
        if now is not None and self.last is not None and now != self.last:
            self.hand_updates += 1
        self.last = now

    def _watch_output(self, module: Any, args: Any, output: Any) -> None:
        if self.out["nonfinite"] is None and nonfinite_output(output):
            self.out["nonfinite"] = {"step": self.step, "kind": "forward output (loss or logits)",
                                     "name": type(module).__name__}

    def _at_step(self, named: list[tuple[str, Any]]) -> None:
        # optimizer.step() is about to read these gradients: judge (or write) them now, before
        # a zero_grad after the step wipes them. Only the first step that ran is compared;
        # every step is searched for NaN/Inf. FSDP2's shards gathered to the full gradients a
        # single process holds (an all-gather each: every rank's optimizer reaches this hook).
        first = "grads0" not in self.out and "grads" not in self.found
        shards = local_slices(named) if first else {}
        named = list(full_named(named))
        norms = None
        if self.norms is None:
            self.norms = norms = gradient_norms(named)
            self.bound = update_bound(self.optimizer)
            self.rates = learning_rates(self.optimizer)
            self.bad = first_nonfinite_of_norms(named, norms)
        else:
            self.bad = first_nonfinite(named)
        if not first:
            return
        if self.to.digest:
            self.found["grads_digest"] = named_digests(named)
        # The reference's snapshot keeps these norms: the same float64 norms of the same tensors.
        self.found["grads"] = compared = self.to.gradients(GRADS0, named, norms=norms)
        if shards and isinstance(compared, list) and not all(c.diff.ok for c in compared):
            self.found["shard_factor"] = shard_factor(shards, self.to.folder, GRADS0, self.to.device)

    def begin_step(self, step: Step) -> None:
        assert self.recorder is not None
        self.step = step.index
        self.recorder.reset()
        self.bad, self.norms, self.bound, self.rates = None, None, None, None
        if "grads0" not in self.out:
            self.found.clear()
        self.last, self.hand_updates = self._fingerprint(), 0

    def end_step(self, at: Step) -> Slice:
        assert self.recorder is not None
        step = at.index
        # Gathered on every rank alike (FSDP2: an all-gather per sharded parameter).
        live = list(full_named((name, p.detach()) for name, p in self.inner.named_parameters()))
        self.stepped = self.stepped or self.recorder.steps > 0
        self._by_hand()  # counts this step's hand-written updates and reads their gradients
        # Hand-written updates count as this step's optimizer steps (``manual_update``).
        self.out["optimizer_steps"].append(self.recorder.steps or self.hand_updates)
        self.out["grad_norms"].append(self.norms)
        self.out["update_bounds"].append(self.bound)
        self.out["learning_rates"].append(self.rates)
        if self.out["nonfinite"] is None:
            # The forward hook saw finite outputs this step: a NaN/Inf gradient then comes from
            # the loss computed on them, or from the backward.
            bad, kind = self.bad, GRADIENT_AFTER_FINITE_FORWARD
            if bad is None:
                bad, kind = first_nonfinite(live), "parameter"
            if bad is not None:
                self.out["nonfinite"] = {"step": step, "kind": kind, "name": bad}
        if "grads0" not in self.out and "grads" in self.found:
            self._first_step(step)
        if self.to.digest and self.to.record:
            self.out["digests"].append((f"parameters after step {step}", named_digests(live)))
        if self.to.writer is not None:
            self.to.writer.write(f"{PARAMS}{step}", live, norms=False)
        elif self.to.record and self.to.sees:
            self.out["params"].append(compare_snapshot(live, self.to.folder, f"{PARAMS}{step}",
                                                       self.to.device, grad=False))
        return {}  # the steps are lists in ``result``

    def _by_hand(self) -> bool:
        """train_step changed the parameters while no optimizer step ran (``p -= lr * p.grad``
        under no_grad, as tutorials write it): the update happened by hand, so what train_step
        left in ``.grad`` is judged as the gradients that update consumed (recorded in
        ``manual_update``). A step a GradScaler skipped leaves the parameters as they were."""
        assert self.recorder is not None
        now = self._fingerprint()
        if now is not None and self.last is not None and now != self.last:
            self.hand_updates += 1
        if not self.hand_updates or self.recorder.steps:
            return False  # an optimizer step ran: a weight renormalised in place is no update
        # The gradients left in .grad (unless a zero_grad after the update read them already).
        self._at_step([(name, None if p.grad is None else p.grad.detach())
                       for name, p in self.inner.named_parameters()])
        self.out["manual_update"].append(self.step)
        return True

    def _first_step(self, step: int) -> None:
        # The first step whose optimizer.step() ran (a GradScaler skips steps with inf
        # gradients, typically the first ones under fp16): its gradients are compared. Before
        # it no parameter moved, so both sides still start from the same weights.
        pre = self.clipping.take()
        self.out["grads0"], self.out["shard_factor"] = self.found["grads"], self.found.get("shard_factor")
        self.out["grads0_step"] = step
        self.out["pre_clip0"] = pre.get("pre_clip")
        if "pre_clip_digest" in pre:
            self.out["digests"].append((f"gradients before clip_grad_norm_ at step {step}", pre["pre_clip_digest"]))
        if "grads_digest" in self.found:
            self.out["digests"].append((f"gradients at optimizer.step() of step {step}", self.found["grads_digest"]))

    def result(self) -> GradientSlice:
        writer = self.to.writer
        if writer is not None:
            # Before returning: the ranks read these files as soon as this world call returns.
            writer.close()
            grads0, pre_clip0 = self.out.get("grads0"), self.out.get("pre_clip0")
            if isinstance(grads0, str):
                self.out["grads0"] = writer.norms(grads0)
            if isinstance(pre_clip0, str):
                self.out["pre_clip0"] = writer.norms(pre_clip0)
            del self.out["digests"]  # the reference compares nothing
        self.out.setdefault("grads0", None)
        self.out.setdefault("grads0_step", None)
        self.out.setdefault("pre_clip0", None)
        return self.out


# -- the recorded run ------------------------------------------------------------------------


@dataclass
class Prepared:
    """One rank's run, built and wrapped, before its first step."""

    target: Any
    ddp: Any
    inner: Any
    optimizer: Any
    to: Destination
    setup: SetupSlice

    def probes(self, plan: RunPlan) -> list[Probe]:
        """The run's probes, in the order they attach (and detach in reverse)."""
        namespaces = [vars(self.target.module), getattr(self.target.train_step, "__globals__", {})]
        allreduce = CommRounds(self.ddp, enabled=plan.count_allreduce)
        clipping = Clipping(self.inner, namespaces, self.to)
        return [allreduce, Gradients(self.ddp, self.inner, self.optimizer, self.to, clipping),
                Forwards(wrapper=self.ddp, inner=self.inner, rounds=allreduce), SyncFlags(self.ddp), clipping,
                BatchDigests(), CompileWatch(self.ddp, self.inner, eager=plan.eager), Features(self.ddp), Routing(),
                StepCollectives(self.inner, rank=self.setup["rank"])]


def _destination(rank_ctx: RankContext, plan: RunPlan) -> Destination:
    """Where this rank's tensors go; raises on every rank alike when rank 0 cannot read the
    reference's snapshots (before any DDP collective)."""
    writes = plan.role == "reference"
    rank = rank_ctx.rank
    snapshots = Path(plan.snapshots) if writes else rank_view(Path(plan.snapshots), rank)
    # The reference finished writing before this run started (its world call returned on
    # every rank first), so an absent index here means: not visible from this rank's host.
    sees = writes or has_snapshot(snapshots, INITIAL)
    seen = [True] if writes else who_sees(rank_ctx, sees)
    if not seen[0]:
        # On every rank alike, before any DDP collective: rank 0 starts every rank from the
        # reference's weights, and is the anchor the other ranks' digests are held against.
        raise FileNotFoundError(
            f"the reference's snapshots are not visible on rank 0's host ({plan.snapshots}/{INITIAL}"
            f"/index.json is missing there): the reference runs on rank 0's host and writes into "
            f"the check's temp dir, which rank 0 must be able to read")
    # The reference's snapshots are written in the background while it trains on (one pending
    # copy at most); every write has landed, index last, before run_recorded returns.
    writer = SnapshotWriter(snapshots, memory=Path(plan.memory) if plan.memory else None) if writes else None
    # Digests only when some rank cannot compare: every rank then digests the same points.
    return Destination(snapshots, rank_ctx.device, writer, sees=sees, digest=not all(seen),
                       record=writes or rank == 0 or plan.record_all_ranks)


def _loss_split(target: Any, model: Any, plan: RunPlan, rank_ctx: RankContext) -> LossSplit | None:
    """``hypotheses.loss_split`` on this run's global batch and its microbatches (the twin's
    N·K), or None when the whole batch does not go through one forward (memory)."""
    whole = global_batch(target, plan.global_batch, seed=plan.seed)
    parts = to_device(shard(whole, rank_ctx.rank, rank_ctx.world_size, plan.microbatches,
                            dims=batch_dims(target)), rank_ctx.device)
    try:
        with run_eagerly():
            return loss_split(model, target.compute_loss, to_device([whole], rank_ctx.device)[0], parts,
                              device=rank_ctx.device)
    except Exception:  # noqa: BLE001 - no measurement, and no cause named from it
        return None


@dataclass(frozen=True, slots=True)
class Settled:
    """What :func:`_settle` did to the model and measured on it before DDP saw it."""

    dropout: list[str]
    rng_left: bool
    group: int
    grouped: list[str]
    split: LossSplit | None
    differs: str | None  # rank 0 of a comparing run: how its build differed from the reference's
    synchronised: list[str]  # BatchNorms whose forward called a collective: never grouped
    first: Any  # this rank's first microbatch (the reference's whole batch), on the device
    layouts: LayoutSlice  # which rows of each BatchNorm's and top-k call's input are which samples


def _settle(target: Target, model: Any, plan: RunPlan, rank_ctx: RankContext, to: Destination) -> Settled:
    """Between building and wrapping: dropout off, what randomness is left measured, BatchNorm
    grouped, the loss split measured and (rank 0 of a comparing run) the reference's initial
    weights loaded and checked."""
    writes, n, rank = to.writer is not None, rank_ctx.world_size, rank_ctx.rank
    dims, whole = batch_dims(target), global_batch(target, plan.global_batch, seed=plan.seed)
    first = to_device(shard(whole, rank, n, plan.microbatches, dims=dims), rank_ctx.device)[0]
    dropout = disable_dropout(model)
    # After switching dropout off: what randomness is left cannot be made equal on both sides.
    # The reference probes a slice of its one microbatch of the N-rank run's microbatch size
    # (norm_group): a size the target's forward runs at on the ranks, at 1/N of the whole
    # batch's cost; the ranks probe their first microbatch.
    probe = ((take_rows(first[0], 0, plan.norm_group, part_dims(dims, 0)),
              take_rows(first[1], 0, plan.norm_group, part_dims(dims, 1)))
             if writes and plan.norm_group else first)
    with run_eagerly():  # a compile here would be thrown away (``watch_compile`` starts cold)
        # The collectives each module's forward calls (every rank alike): synchronised BatchNorms.
        rng_left, synchronised = watch_synchronising(model, rank, lambda: forward_is_random(
            model, lambda m: target.compute_loss(m, *probe), device=rank_ctx.device))
        group = plan.norm_group or plan.global_batch // (n * plan.microbatches)
        # Which rows of each BatchNorm's input are which samples, alike on every side (``batch_layout``),
        # its forwards leaving buffers and generators as they were (MoCo's queue pointer).
        with state_kept(model, device=rank_ctx.device):
            layouts = observe_layouts(model, target.compute_loss, to_device([whole], rank_ctx.device)[0], dims)
    grouped = group_batchnorm(model, group, keep={*synchronised, *plan.ungrouped}, layouts=layouts.norms)
    # After grouping BatchNorm: the whole batch then normalises in the pieces' groups.
    split = _loss_split(target, model, plan, rank_ctx) if plan.measure_loss_split else None
    # Before wrapping, on rank 0 only: DDP's construction broadcast then carries rank 0's
    # (reference-checked) weights to every rank, including ranks that cannot read the files.
    differs = _verify_initial(model, to.folder, rank_ctx.device) if not writes and rank == 0 else None
    nudge(model, ulps=plan.nudge_ulps)
    return Settled(dropout, rng_left, group, grouped, split, differs, synchronised, first, layouts.records(grouped))


def prepare(rank_ctx: RankContext, plan: RunPlan) -> Prepared:
    """The target's model built from the suite's seed, dropout off, BatchNorm grouped, started
    from the reference's initial weights, wrapped in DDP with the target's ``ddp_kwargs``."""
    to = _destination(rank_ctx, plan)
    run = RankRun.load(rank_ctx, plan.target_spec)
    wrapped = run.build_wrapped(seed=plan.seed, ddp_overrides=plan.ddp_overrides,
                                before_wrap=lambda model: _settle(run.target, model, plan, rank_ctx, to))
    settled, ddp, inner = wrapped.settled, wrapped.ddp, wrapped.model
    setup = SetupSlice(rank=rank_ctx.rank, ddp_kwargs=repr(wrapped.ddp_kwargs), wrapper=wrapper_of(ddp),
                       comm_hook=comm_hook_of(ddp, uncompressed=plan.uncompressed),
                       dropout_disabled=settled.dropout, rng_in_forward=settled.rng_left,
                       batchnorm_grouped=settled.grouped, batchnorm_group=settled.group if settled.grouped else None,
                       batchnorm_synchronised=settled.synchronised, sync_batchnorm_substituted=substituted(inner),
                       **settled.layouts)
    if settled.split is not None:
        setup["loss_split"] = settled.split
    # After DDP's construction broadcast (every rank at the reference's weights), on every rank.
    # Not under a target's parallelize: an extra forward of an FSDP2 module outside its step
    # leaves its unshard state for a backward that never comes (the next step aborts).
    started = (measure_start_loss(inner, run.target, settled.first, device=rank_ctx.device)
               if plan.microbatches == 1 and run.target.parallelize is None else None)
    if started is not None:
        setup["start_loss"] = started
    optimizer = wrapped.make_optimizer()
    differs = settled.differs
    if to.writer is not None:
        to.writer.write(INITIAL, full_named(inner.state_dict().items()), norms=False)
    else:
        if rank_ctx.rank != 0 and to.sees:
            # After the construction broadcast, as a second look: with broadcast_buffers=False
            # DDP leaves buffers rank-local, and a rank that can read the files fixes its own.
            differs = _verify_initial(inner, to.folder, rank_ctx.device, buffers_only=True)
        setup["initial_differs_from_reference"] = differs
        setup["compared_by"] = REFERENCE if to.sees else DIGEST
    return Prepared(run.target, ddp, inner, optimizer, to, setup)


def run_recorded(rank_ctx: RankContext, plan: RunPlan) -> RankRecord:
    """Run ``plan.steps`` steps of the target's ``train_step`` under DDP on this rank, observed
    by the run's instruments; the rank's record is their slices (``records``).

    ``plan.role == "reference"`` (the 1-rank world): write ``initial`` (parameters and buffers
    after wrapping), ``grads0`` (the gradients consumed by the first ``optimizer.step()`` that
    ran, at step ``grads0_step``: 0 unless a GradScaler skipped steps), ``pre_clip0`` (the
    gradients before that step's last clip, when the step clips) and ``params<s>`` (after every
    step) into ``plan.snapshots``; return the norms of the written gradients.
    ``plan.role == "compare"`` (the N-rank world): start from the reference's initial weights
    (``_verify_initial``) and compare the same points against the reference's snapshots *here*,
    returning per-tensor summaries (``tensors.Compared``). No tensor is returned, and no
    snapshot of the model is held: gradients and parameters are written or compared where they
    live, at the moment they are what the optimizer consumed.
    """
    run = prepare(rank_ctx, plan)
    observation = Observation(run.probes(plan))
    steps = (Step(step, global_batch(run.target, plan.global_batch, seed=plan.seed + step))
             for step in range(plan.steps))

    def train(step: Step) -> None:
        micro = to_device(shard(step.batch, rank_ctx.rank, rank_ctx.world_size, plan.microbatches,
                                dims=batch_dims(run.target)), rank_ctx.device)
        # train_step runs forward/backward on every rank: each backward that is not under
        # no_sync is a collective, so all ranks execute the same number of steps.
        run.target.run_step(run.ddp, run.optimizer, micro[::-1] if plan.reverse_microbatches else micro,
                            step=step.index)

    with contextlib.ExitStack() as stack:
        if run.to.writer is not None:
            # A step that raises: the pending write still finishes before the error leaves this
            # rank (the supervisor then removes the folder under no thread's feet).
            stack.callback(run.to.writer.settle)
        observation.run_steps(steps, train)
    record: dict[str, Any] = {**run.setup, "batchnorm_sizes_seen": sizes_seen(run.inner)}
    record.update(observation.result())
    return cast(RankRecord, record)
