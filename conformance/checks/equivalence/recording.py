"""One recorded training run of the target: the rank-side experiment of the equivalence checks.

Where the comparison happens: the single-process reference runs *first* and writes its
snapshots (initial weights, first-step gradients, parameters after every step) to files in
the check's private temp dir, one tensor at a time (``snapshots``); the N-rank ranks then
compare their own live tensors against those files, tensor by tensor, on their device, at the
very moment the optimizer consumes them, and return summaries only. This way round (rather
than ranks writing and the reference comparing) the disk holds one copy of the model per
snapshot instead of N, the N comparisons run in parallel on the ranks' devices, and no rank
ever keeps a copy of its gradients or parameters: its memory overhead is the one reference
tensor being compared. Initial weights: the reference builds from the same seed; rank 0,
before wrapping, checks its weights bit for bit against the reference's initial snapshot and
copies the reference's in where a non-deterministic ``build_model`` made them differ
(recorded); DDP's construction broadcast carries them to every rank (and every other rank that
can read the files checks again after it: rank-local buffers), so both runs start from exactly
the same weights either way.

A rank that cannot see the files (``--attach`` across hosts: the reference ran on rank 0's
host) digests the same tensors at the same points instead, and so does every rank that
compares (only in such a run), for the judge to carry the comparison over by bit identity
(``digests``).

Build the target's model from the suite's seed, wrap it in DDP with the target's
``ddp_kwargs``, feed each rank its contiguous shard of the global batch as K microbatches, run
the target's own ``train_step`` and record what the optimizer consumed. The single-process
reference is the *same function* run in a 1-rank world with the whole global batch, so nothing
about "what a step should do" is re-implemented here.

Recorded per step (see ``instruments``): the gradients at the first ``optimizer.step()``
(a step pre-hook: ``zero_grad`` before or after the step, ``set_to_none`` or not, all read
the same), how many optimizer steps, forwards through DDP and through the inner module,
all-reduce calls and rounds (a counting comm hook), what ``clip_grad_norm_`` measured and the
gradients before it clipped them, and the first NaN/Inf (forward output, gradient, parameter).
Before the run, dropout is switched off and BatchNorm normalises in fixed groups on both sides
(``randomness``, ``normalisation``): the record says so.

``run_recorded`` is module-level so that it pickles by reference into the spawned rank
processes; it returns plain Python and per-tensor summaries only, never a tensor.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...harness.batches import digest as batch_digest
from ...harness.batches import take_rows
from ...harness.ddp import (
    MODEL_SEED,
    build_model,
    counting_allreduce,
    disable_tf32,
    effective_ddp_kwargs,
    global_batch,
    shard,
    to_device,
    unwrap,
    wrap,
)
from ...harness.features import FeatureProbe
from .tensors import Compared
from .compiled import output_site, run_eagerly, watch_compile
from .compression import comm_hook_of
from .digests import DIGEST, REFERENCE, named_digests, rank_view, who_sees
from .instruments import ClipProbe, ForwardCounter, StepRecorder, first_nonfinite
from .normalisation import group_batchnorm, sizes_seen
from .randomness import disable_dropout, forward_is_random
from .routing import RoutingProbe
from .snapshots import SnapshotWriter, compare_snapshot, has_snapshot, read_snapshot

# Snapshot labels of the reference (``snapshots``): the initial weights, the first step's
# gradients, the gradients before that step's clipping, the parameters after step s.
INITIAL, GRADS0, PRE_CLIP0, PARAMS = "initial", "grads0", "pre_clip0", "params"
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

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"role={self.role!r} must be one of {ROLES}")
        if self.steps < 1 or self.microbatches < 1 or self.global_batch < 1 or self.norm_group < 0:
            raise ValueError(f"steps={self.steps}, microbatches={self.microbatches}, "
                             f"global_batch={self.global_batch} must all be >= 1 and "
                             f"norm_group={self.norm_group} >= 0")


def _nonfinite_output(output: Any) -> bool:
    import torch

    tensors = output if isinstance(output, (tuple, list)) else (output,)
    return any(isinstance(t, torch.Tensor) and t.is_floating_point()
               and not bool(torch.isfinite(t.detach()).all()) for t in tensors)


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


def run_recorded(rank_ctx: Any, plan: RunPlan) -> dict[str, Any]:
    """Run ``plan.steps`` steps of the target's ``train_step`` under DDP on this rank.

    ``plan.role == "reference"`` (the 1-rank world): write ``initial`` (parameters and buffers
    after wrapping), ``grads0`` (the gradients consumed by the first ``optimizer.step()`` that
    ran, at step ``grads0_step``: 0 unless a GradScaler skipped steps), ``pre_clip0`` (the
    gradients before that step's last clip, when the step clips) and ``params<s>`` (after every
    step) into ``plan.snapshots``; return the norms of the written gradients.
    ``plan.role == "compare"`` (the N-rank world): start from the reference's initial weights
    (``_verify_initial``) and compare the same points against the reference's snapshots *here*,
    returning per-tensor summaries (``tensors.Compared``): ``grads0``, ``pre_clip0``,
    ``params`` (per step). Both roles return per step: ``optimizer_steps``, ``ddp_forwards``,
    ``inner_forwards``, ``allreduce_calls``, ``allreduce_rounds``, ``buckets_per_step``,
    ``clip_calls``, ``batch_digests``; once: ``nonfinite`` (the first NaN/Inf),
    ``dropout_disabled``, ``rng_in_forward``, ``batchnorm_grouped``, ``batchnorm_sizes_seen``.
    No tensor is returned, and no snapshot of the model is held: gradients and parameters are
    written or compared where they live, at the moment they are what the optimizer consumed.
    """
    from ...harness.targets import load_target

    writes = plan.role == "reference"
    n, rank = rank_ctx.world_size, rank_ctx.rank
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
    # Digests only when some rank cannot compare: every rank then digests the same points.
    digest = not all(seen)
    disable_tf32()
    target = load_target(plan.target_spec)
    model = build_model(target, rank_ctx.device, seed=plan.seed)
    first = to_device(shard(global_batch(target, plan.global_batch, seed=plan.seed), rank, n,
                            plan.microbatches), rank_ctx.device)[0]
    dropout = disable_dropout(model)
    # After switching dropout off: what randomness is left cannot be made equal on both sides.
    # The reference probes a slice of its one microbatch of the N-rank run's microbatch size
    # (norm_group): a size the target's forward runs at on the ranks, at 1/N of the whole
    # batch's cost; the ranks probe their first microbatch.
    probe = ((take_rows(first[0], 0, plan.norm_group), take_rows(first[1], 0, plan.norm_group))
             if writes and plan.norm_group else first)
    with run_eagerly():  # a compile here would be thrown away (``watch_compile`` starts cold)
        rng_left = forward_is_random(model, lambda m: target.compute_loss(m, *probe), device=rank_ctx.device)
    group = plan.norm_group or plan.global_batch // (n * plan.microbatches)
    grouped = group_batchnorm(model, group)
    kwargs = effective_ddp_kwargs(target, plan.ddp_overrides)
    # Before wrapping, on rank 0 only: DDP's construction broadcast then carries rank 0's
    # (reference-checked) weights to every rank, including ranks that cannot read the files.
    differs = _verify_initial(model, snapshots, rank_ctx.device) if not writes and rank == 0 else None
    ddp = wrap(model, rank_ctx.device, kwargs, target=target)
    hook = comm_hook_of(ddp, uncompressed=plan.uncompressed)
    inner = unwrap(ddp)
    optimizer = target.make_optimizer(ddp)
    record = writes or rank == 0 or plan.record_all_ranks
    out: dict[str, Any] = {"rank": rank, "ddp_kwargs": repr(kwargs), "comm_hook": hook,
                           "dropout_disabled": dropout,
                           "rng_in_forward": rng_left, "batchnorm_grouped": grouped,
                           "batchnorm_group": group if grouped else None}
    # The reference's snapshots are written in the background while it trains on (one pending
    # copy at most); every write has landed, index last, before this function returns.
    writer = SnapshotWriter(snapshots, memory=Path(plan.memory) if plan.memory else None) if writes else None
    if writer is not None:
        writer.write(INITIAL, inner.state_dict().items(), norms=False)
    else:
        if rank != 0 and sees:
            # After the construction broadcast, as a second look: with broadcast_buffers=False
            # DDP leaves buffers rank-local, and a rank that can read the files fixes its own.
            differs = _verify_initial(inner, snapshots, rank_ctx.device, buffers_only=True)
        out["initial_differs_from_reference"] = differs
        out["compared_by"] = REFERENCE if sees else DIGEST
    digests: list[tuple[str, list[tuple[str, str | None]]]] = []
    per_step: dict[str, list[Any]] = {k: [] for k in (
        "optimizer_steps", "ddp_forwards", "inner_forwards", "allreduce_calls", "allreduce_rounds",
        "buckets_per_step", "clip_calls", "batch_digests", "routing", "unsynchronised_forwards")}
    params: list[list[Compared]] = []
    nonfinite: dict[str, Any] | None = None
    current = {"step": 0}
    found: dict[str, Any] = {}  # what the hooks measured at the first optimizer step that ran
    this_step: dict[str, Any] = {}  # the first non-finite gradient at this step's optimizer.step()

    def watch_output(module: Any, args: Any, output: Any) -> None:
        nonlocal nonfinite
        if nonfinite is None and _nonfinite_output(output):
            nonfinite = {"step": current["step"], "kind": "forward output (loss or logits)",
                         "name": type(module).__name__}

    def at_step(named: list[tuple[str, Any]]) -> None:
        # optimizer.step() is about to read these gradients: judge (or write) them now, before
        # a zero_grad after the step wipes them. Only the first step that ran is compared;
        # every step is searched for NaN/Inf.
        this_step["bad"] = first_nonfinite(named)
        if "grads0" in out or "grads" in found:
            return
        if digest:
            found["grads_digest"] = named_digests(named)
        if not record or not sees:
            found["grads"] = None
        elif writer is not None:
            writer.write(GRADS0, named)
            found["grads"] = GRADS0  # its norms: once written (``writer.norms``)
        else:
            found["grads"] = compare_snapshot(named, snapshots, GRADS0, rank_ctx.device, grad=True)

    def at_clip(named: list[tuple[str, Any]]) -> None:
        # Every clip before the first step overwrites the last: the last clip's input counts.
        if not record:
            return
        if digest:
            found["pre_clip_digest"] = named_digests(named)
        if writer is not None:
            writer.write(PRE_CLIP0, named)
            found["pre_clip"] = PRE_CLIP0
        elif sees and has_snapshot(snapshots, PRE_CLIP0):
            found["pre_clip"] = compare_snapshot(named, snapshots, PRE_CLIP0, rank_ctx.device, grad=True)

    namespaces = [vars(target.module), getattr(target.train_step, "__globals__", {})]
    with contextlib.ExitStack() as stack:
        if writer is not None:
            # A step that raises: the pending write still finishes before the error leaves this
            # rank (the supervisor then removes the folder under no thread's feet).
            stack.callback(writer.settle)
        counts = stack.enter_context(counting_allreduce(ddp)) if plan.count_allreduce else None
        recorder = StepRecorder.attach(inner, optimizer, observe=at_step)
        stack.callback(recorder.close)
        forwards = ForwardCounter.attach(ddp, inner, rounds=(lambda: counts["rounds"]) if counts is not None else None)
        stack.callback(forwards.close)
        clip = ClipProbe.attach(inner, namespaces, observe=at_clip)
        stack.callback(clip.close)
        stack.callback(output_site(ddp, inner).register_forward_hook(watch_output).remove)
        compiled = stack.enter_context(watch_compile(ddp, inner, eager=plan.eager))
        # Which production features the step uses (autocast, GradScaler, checkpointing…),
        # seen while it runs: the report's configuration table (harness.features).
        features = stack.enter_context(FeatureProbe.watching(ddp))
        # Top-k decisions (a mixture of experts' routing), compared across sides (``routing``).
        routing = stack.enter_context(RoutingProbe.watching())
        for step in range(plan.steps):
            current["step"] = step
            batch = global_batch(target, plan.global_batch, seed=plan.seed + step)
            # Every rank draws the *same* global batch from the same seed, unless the data it
            # draws from was built differently in this process (a per-rank dataset).
            per_step["batch_digests"].append(batch_digest(batch[0]) + batch_digest(batch[1]))
            micro = to_device(shard(batch, rank, n, plan.microbatches), rank_ctx.device)
            if plan.reverse_microbatches:
                micro = micro[::-1]
            before = (counts["calls"], counts["rounds"]) if counts is not None else (0, 0)
            if counts is not None:
                counts["indices"] = set()
            recorder.reset()
            this_step.clear()
            clip.calls = []
            if "grads0" not in out:
                found.clear()
                clip.frozen = False
            # train_step runs forward/backward on every rank: each backward that is not under
            # no_sync is a collective, so all ranks execute the same number of steps.
            target.run_step(ddp, optimizer, micro, step=step)
            per_step["optimizer_steps"].append(recorder.steps)
            per_step["routing"].append(routing.take())
            per_step["unsynchronised_forwards"].append(forwards.unsynchronised())
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
            live = [(name, p.detach()) for name, p in inner.named_parameters()]
            if nonfinite is None:
                # The forward hook saw finite outputs this step: a NaN/Inf gradient then comes from
                # the loss computed on them, or from the backward.
                bad = this_step.get("bad")
                kind = GRADIENT_AFTER_FINITE_FORWARD
                if bad is None:
                    bad, kind = first_nonfinite(live), "parameter"
                if bad is not None:
                    nonfinite = {"step": step, "kind": kind, "name": bad}
            if "grads0" not in out and "grads" in found:
                # The first step whose optimizer.step() ran (a GradScaler skips steps with inf
                # gradients, typically the first ones under fp16): its gradients are compared.
                # Before it no parameter moved, so both sides still start from the same weights.
                out["grads0"] = found["grads"]
                out["grads0_step"] = step
                out["pre_clip0"] = found.get("pre_clip")
                clip.frozen = True
                if "pre_clip_digest" in found:
                    digests.append((f"gradients before clip_grad_norm_ at step {step}",
                                    found["pre_clip_digest"]))
                if "grads_digest" in found:
                    digests.append((f"gradients at optimizer.step() of step {step}",
                                    found["grads_digest"]))
            if digest and record:
                digests.append((f"parameters after step {step}", named_digests(live)))
            if writer is not None:
                writer.write(f"{PARAMS}{step}", live, norms=False)
            elif record and sees:
                params.append(compare_snapshot(live, snapshots, f"{PARAMS}{step}", rank_ctx.device,
                                                grad=False))
            del live
    if writer is not None:
        # Before returning: the ranks read these files as soon as this world call returns.
        writer.close()
        for key in ("grads0", "pre_clip0"):
            if out.get(key) is not None:
                out[key] = writer.norms(out[key])
    out.setdefault("grads0", None)
    out.setdefault("grads0_step", None)
    out.setdefault("pre_clip0", None)
    out.update(per_step)
    out["params"] = [] if writes else params
    if not writes:
        out["digests"] = digests
    out["nonfinite"] = nonfinite
    out["batchnorm_sizes_seen"] = sizes_seen(inner)
    out["compile"] = compiled or None
    out["features"] = features.result()
    return out

