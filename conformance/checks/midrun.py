"""rank-consistency's mid-run look: digests at every optimizer step of the target's ``run_loop``.

Why mid-run: ``torch.distributed.algorithms.Join`` broadcasts the model from the last rank to
finish when it exits, so parameters that drifted apart *during* an epoch agree again at its end
and a look after the loop sees nothing. The classic case is a GradScaler: only the ranks still
training in Join's tail update their loss scale, the scales then differ in the next epoch, each
rank unscales DDP's averaged gradient by its own scale, and the parameters part ways until the
next Join re-syncs them.

Rank side (:func:`watch_loop`, in a fresh world): the target's ``run_loop(ctx)`` runs with, for
the loop's duration only,

- a global optimizer step post-hook (``torch.optim.optimizer.register_optimizer_step_post_hook``:
  every optimizer the loop creates, however it creates it), taken where the *outermost* step
  returns (a pre-hook counts the steps in progress): ``ZeroRedundancyOptimizer.step`` runs its
  local optimizer's step on this rank's shard and broadcasts the shards after it, so a look at
  the inner step's end would see ranks that differ by design;
- ``GradScaler.step`` wrapped: a scaler's step is one checkpoint whether or not it ran the
  optimizer (a step skipped on inf/NaN is a checkpoint too, marked skipped), and the scalers
  the loop uses are found there;
- ``Join.__enter__``/``__exit__`` wrapped: steps are counted per Join block, so ranks are
  compared step i of block b against step i of block b (a rank that left Join early has fewer
  steps in that block: the tail is compared among the ranks that ran it), and the state right
  after Join's re-sync is a checkpoint of its own.

At each checkpoint every rank digests the parameters of every model ``ctx.wrap`` returned and
the state of every scaler seen (scale, growth tracker); only these digests travel.
Supervisor side (:func:`judge`): the first checkpoint where ranks differ, what differed, and
whether the end state agreed.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..harness.observe import CallCounts, Counts, Forwards, OptimizerSteps
from ..harness.patching import replaced as _replaced
from ..harness.world import RankContext
from .loop_calls import advice as calls_advice
from .loop_calls import uneven

#: What a loop that never creates a checkpoint is told (nothing mid-run was compared).
NO_STEPS = "run_loop took no optimizer step"
#: The kinds of checkpoint compared step by step: optimizer steps, or (in a loop that never
#: steps an optimizer) the starts of its training forwards.
STEPS = ("step", "forward")


# -- rank side --------------------------------------------------------------------------------

def _clean(name: str) -> str:
    """A parameter's name inside the user's model: without torch.compile's and DDP's prefixes."""
    for prefix in ("_orig_mod.", "module."):
        while name.startswith(prefix):
            name = name[len(prefix):]
    return name


class Recorder:
    """This rank's checkpoints, in order. Mutable by nature: the hooks append as the loop runs."""

    def __init__(self, models: list[Any]) -> None:
        self.models = models  # the LoopContext's list: filled by ctx.wrap as the loop wraps
        self.points: list[dict[str, Any]] = []
        self.scalers: list[Any] = []
        self.optimizers: list[Any] = []
        self.block = 0  # odd: inside Join block (block + 1) // 2; even: outside any Join
        self.join_depth = 0
        self.in_block = 0
        self.rank_step = 0
        self.scaler_depth = 0
        self.scaler_stepped = False
        self.step_depth = 0  # optimizer steps in progress: >1 inside a wrapping optimizer's step
        self.counts = Counts()  # forwards and torch.distributed collectives so far (loop_calls)
        self.forwards = 0  # "forward" checkpoints taken
        self.last_forward: dict[str, str] | None = None  # the parameters at the last one
        #: At the first optimizer step of an FSDP2 model: its optimizer's state or parameters not
        #: laid out as the model's (``optimizer_state.layout_problems``), with the step's label.
        self.layout: list[str] = []

    def _params(self) -> dict[str, str]:
        from ..harness.ddp import tensor_digest

        out: dict[str, str] = {}
        if self.models:
            for i, model in enumerate(self.models):
                prefix = f"model{i}." if len(self.models) > 1 else ""
                for name, p in model.named_parameters():
                    out[prefix + _clean(name)] = tensor_digest(p)
            return out
        # A loop that wrapped outside ctx.wrap: the optimizers' parameters, by position.
        for o, opt in enumerate(self.optimizers):
            for g, group in enumerate(getattr(opt, "param_groups", None) or []):
                for i, p in enumerate(group["params"]):
                    out[f"optimizer{o}.param_groups[{g}][{i}]"] = tensor_digest(p)
        return out

    def _scaler_states(self) -> list[dict[str, Any]]:
        return [{"scale": float(s.get_scale()), "growth_tracker": int(s._get_growth_tracker())}
                for s in self.scalers if s.is_enabled()]

    def _learning_rates(self) -> list[float]:
        """Every param group's ``lr`` of the optimizers seen, in order (a float or a tensor)."""
        return [float(group["lr"]) for opt in self.optimizers for group in getattr(opt, "param_groups", None) or []
                if isinstance(group, dict) and "lr" in group]

    def record(self, kind: str, *, skipped: bool | None = None, params: dict[str, str] | None = None) -> None:
        index = self.in_block if kind == "step" else self.forwards if kind == "forward" else None
        point = {"kind": kind, "block": self.block, "index": index, "rank_step": self.rank_step,
                 "params": self._params() if params is None else params, "scalers": self._scaler_states(),
                 "skipped": skipped, "calls": dict(self.counts), "lrs": self._learning_rates()}
        self.points.append(point)
        if kind == "step":
            self.in_block += 1
            self.rank_step += 1
        elif kind == "forward":
            self.forwards += 1

    def training_forward(self) -> None:
        """A training forward of a wrapped model starts: a checkpoint while no optimizer step
        has been seen, if the parameters changed since the last one (the judge compares these
        only in a loop that never steps an optimizer: a hand-written update, ``p -= lr *
        p.grad``, leaves nothing else to compare at). Checkpoint i is then "after i updates"
        on every rank, whatever forwards a rank ran in between (accumulation, a rank's extra
        forward for its logs)."""
        if self.optimizers or self.scalers or self.step_depth:
            return
        params = self._params()
        if self.last_forward != params:
            self.last_forward = params
            self.record("forward", params=params)

    def _check_layout(self, optimizer: Any) -> None:
        """An optimizer's first step on FSDP2 models: does it step their parameters, with its
        state laid out as they are? (One built before ``fully_shard`` steps the replaced ones.)"""
        from ..harness.parallel import is_fsdp2
        from .optimizer_state import layout_problems

        models = [m for m in self.models if is_fsdp2(m)]
        if models and not self.layout:
            self.layout = layout_problems(models, optimizer)

    def _new_block(self) -> None:
        self.block += 1
        self.in_block = 0

    # -- the hooks --
    def optimizer_stepping(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.step_depth += 1

    def optimizer_stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.step_depth = max(0, self.step_depth - 1)
        if self.step_depth:
            # An optimizer stepped inside another's step: ZeroRedundancyOptimizer's local
            # optimizer updates this rank's shard, and only then does ZeRO's step broadcast
            # every shard. The checkpoint is where the user's optimizer.step() returns.
            return
        if optimizer not in self.optimizers:
            self.optimizers.append(optimizer)
            self._check_layout(optimizer)
        if self.scaler_depth:
            self.scaler_stepped = True  # the scaler's step is the checkpoint
            return
        self.record("step")

    def scaler_step(self, original: Callable[..., Any]) -> Callable[..., Any]:
        recorder = self

        def step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            if scaler not in recorder.scalers:
                recorder.scalers.append(scaler)
            recorder.scaler_depth += 1
            recorder.scaler_stepped = False
            try:
                out = original(scaler, optimizer, *args, **kwargs)
            finally:
                recorder.scaler_depth -= 1
            if optimizer not in recorder.optimizers:
                recorder.optimizers.append(optimizer)
            # Recorded before update(): the scale this step's gradients were multiplied by.
            recorder.record("step", skipped=not recorder.scaler_stepped)
            return out

        return step

    def join_enter(self, original: Callable[..., Any]) -> Callable[..., Any]:
        recorder = self

        def enter(join: Any) -> Any:
            out = original(join)
            recorder.join_depth += 1
            if recorder.join_depth == 1:
                recorder._new_block()
            return out

        return enter

    def join_exit(self, original: Callable[..., Any]) -> Callable[..., Any]:
        recorder = self

        def exit_(join: Any, kind: Any, value: Any, tb: Any) -> Any:
            # Join's exit shadows the peers' collectives until every rank is done, then
            # re-syncs the model: the checkpoint is taken after it.
            out = original(join, kind, value, tb)
            recorder.join_depth -= 1
            if recorder.join_depth == 0 and kind is None:
                recorder.record("join-exit")
                recorder._new_block()
            return out

        return exit_


@contextlib.contextmanager
def watching(recorder: Recorder) -> Iterator[None]:
    """The recorder's hooks installed for the block: the optimizer-step probe (torch's global
    step hooks, GradScaler.step wrapped) and Join's enter/exit wrapped (at class level: the
    loop creates its own)."""
    from torch.distributed.algorithms.join import Join

    with contextlib.ExitStack() as stack:
        OptimizerSteps(pre=recorder.optimizer_stepping, post=recorder.optimizer_stepped,
                       scaler_step=recorder.scaler_step).attach(stack)
        stack.enter_context(_replaced(Join, "__enter__", recorder.join_enter))
        stack.enter_context(_replaced(Join, "__exit__", recorder.join_exit))
        yield


@contextlib.contextmanager
def _hookless_optimizers(module: Any, recorder: Recorder) -> Iterator[None]:
    """The target module's ``build_optimizer`` wrapped for the loop: an optimizer it returns
    without step hooks (a hand-written object with ``step()``) gets its ``step`` wrapped on
    the instance, so the global hooks' checkpoints reach it too. A loop that builds such an
    object some other way is not seen (its record says no optimizer step was observed)."""
    build = getattr(module, "build_optimizer", None)
    if not callable(build):
        yield
        return

    def build_optimizer(*args: Any, **kwargs: Any) -> Any:
        optimizer = build(*args, **kwargs)
        if not callable(getattr(optimizer, "register_step_pre_hook", None)) and callable(
                getattr(optimizer, "step", None)):
            original = optimizer.step

            def step(*a: Any, **kw: Any) -> Any:
                recorder.optimizer_stepping(optimizer, a, kw)
                out = original(*a, **kw)
                recorder.optimizer_stepped(optimizer, a, kw)
                return out

            optimizer.step = step
        return optimizer

    module.build_optimizer = build_optimizer
    try:
        yield
    finally:
        module.build_optimizer = build


def watch_loop(rank_ctx: RankContext, target_spec: str, steps: int) -> dict[str, Any]:
    """Run the target's ``run_loop`` on this rank with the recorder's hooks; return the digests.

    The world this runs in is fresh with a short process-group timeout (rank_consistency): a
    loop that hangs releases its ranks by that timeout, and whatever it left pending in the
    default group dies with the world. The user's own exception is a TargetError (exit 2);
    any other (a collective's timeout, DDP's own error) comes back as data with the
    checkpoints taken before it.
    """
    from ..harness.rank_run import RankRun
    from ..harness.target_calls import one_line
    from ..harness.targets import TargetError, call_target

    run = RankRun.load(rank_ctx, target_spec)
    target = run.target
    scratch = Path(rank_ctx.tmpdir) / f"midrun-rank{rank_ctx.rank}"
    scratch.mkdir(parents=True, exist_ok=True)
    # The target's configure_ddp runs on every model ctx.wrap returns, as in production.
    loop = run.loop_context(steps=steps, tmpdir=scratch)
    if target.run_loop is None:
        raise ValueError(f"target {target.name!r} defines no run_loop: there is no loop to watch")
    recorder = Recorder(loop.models)
    # Every model the loop wraps: its forwards counted (training or not), and a checkpoint at
    # each training forward's start while no optimizer step has been seen.
    forwards = Forwards(kinds=recorder.counts, on_training=recorder.training_forward)
    loop.on_wrap = forwards.watch
    error = None
    try:
        with watching(recorder), _hookless_optimizers(target.module, recorder), \
                CallCounts(recorder.counts).attached(), forwards.attached():
            call_target(target, "run_loop", target.run_loop, loop)
    except TargetError:
        raise
    except Exception as exc:  # noqa: BLE001 -- reported with the checkpoints before it, not a crash
        error = one_line(exc)[:400]
    else:
        recorder.record("end")
    return {"points": recorder.points, "error": error, "calls": dict(recorder.counts),
            "layout": recorder.layout}


# -- supervisor side --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Difference:
    """The first checkpoint at which some rank differs from the lowest rank that reached it."""

    label: str
    kind: str  # "step" | "join-exit" | "end"
    rank: int  # the differing rank
    reference_rank: int
    parameter: str | None  # the first differing parameter (registration order), if any
    scales: dict[int, float] | None  # per rank, when a scaler's state differs
    growth_trackers: dict[int, int] | None
    skipped: dict[int, bool] | None  # per rank, for a scaler's step
    rank_steps: dict[int, int]
    #: Per rank, what it had done by this checkpoint besides training (``loop_calls``).
    calls: dict[int, dict[str, int]] = field(default_factory=dict)
    #: Per rank, its optimizers' learning rates here, when they differ across ranks.
    lrs: dict[int, list[float]] | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"when": self.label, "kind": self.kind, "rank": self.rank, "learning_rates": _keyed(self.lrs),
                "reference_rank": self.reference_rank, "parameter": self.parameter,
                "scales": _keyed(self.scales), "growth_trackers": _keyed(self.growth_trackers),
                "skipped": _keyed(self.skipped), "rank_steps": _keyed(self.rank_steps),
                "calls": _keyed(self.calls) or {}}


def _keyed(values: dict[int, Any] | None) -> dict[str, Any] | None:
    return None if values is None else {str(k): v for k, v in sorted(values.items())}


@dataclass(frozen=True)
class MidRun:
    """What the mid-run look found, for the record."""

    checkpoints: int  # checkpoints compared across at least two ranks
    steps_per_rank: dict[int, int]
    join_blocks: int
    first: Difference | None  # the first difference of any kind
    first_parameter: Difference | None  # the first checkpoint where parameters differ
    end_params_agree: bool | None  # after run_loop (None: some rank has no end: it raised)
    end_scalers_agree: bool | None
    errors: dict[int, str] = field(default_factory=dict)
    #: Per rank, the checkpoints at which its GradScaler skipped the step (inf/NaN gradients).
    skipped: dict[int, list[str]] = field(default_factory=dict)
    scaled: bool = False  # a GradScaler (enabled) was seen on some rank
    #: No optimizer step anywhere: the checkpoints are the starts of the training forwards.
    by_forward: bool = False
    #: Per rank, its counts when run_loop returned or raised (``loop_calls``).
    calls: dict[int, dict[str, int]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {"checkpoints_compared": self.checkpoints, "join_blocks": self.join_blocks,
                "steps_per_rank": _keyed(self.steps_per_rank),
                "first_difference": None if self.first is None else self.first.as_dict(),
                "first_parameter_difference": (None if self.first_parameter is None
                                               else self.first_parameter.as_dict()),
                "end_parameters_agree": self.end_params_agree,
                "end_scalers_agree": self.end_scalers_agree, "errors": _keyed(self.errors) or {},
                "skipped_steps": _keyed(self.skipped) or {}, "grad_scaler": self.scaled,
                "checkpoints_at": "training forwards" if self.by_forward else "optimizer steps",
                "calls": _keyed(self.calls) or {}}


def _block_label(block: int, has_join: bool) -> str:
    if block % 2:
        return f"Join block {(block + 1) // 2}"
    if not has_join:
        return ""
    return "before the first Join" if block == 0 else f"after Join block {block // 2}"


def _label(point: dict[str, Any], has_join: bool) -> str:
    where = _block_label(point["block"], has_join)
    if point["kind"] in STEPS:
        what = (f"optimizer step {point['index']}" if point["kind"] == "step" else
                f"the first training forward after {point['index']} hand-written update(s)")
        return what + (f" of {where}" if where.startswith("Join") else f" ({where})" if where else "")
    if point["kind"] == "join-exit":
        return f"the exit of {where} (after its re-sync)"
    return "the end of run_loop"


def _compare(points: dict[int, dict[str, Any]], has_join: bool) -> Difference | None:
    ranks = sorted(points)
    ref_rank = ranks[0]
    ref = points[ref_rank]
    for rank in ranks[1:]:
        other = points[rank]
        params_differ = other["params"] != ref["params"]
        # Right after Join's exit only the model has been re-synced (by Join); the loop re-syncs
        # its scaler, if it does, on the next lines. Scalers are compared at the steps and the end.
        scalers_differ = other["scalers"] != ref["scalers"] and ref["kind"] != "join-exit"
        if not (params_differ or scalers_differ):
            continue
        parameter = next((n for n in ref["params"] if other["params"].get(n) != ref["params"][n]),
                         None) if params_differ else None
        scales = trackers = None
        if scalers_differ or any(p["scalers"] for p in points.values()):
            scales = {r: p["scalers"][0]["scale"] for r, p in points.items() if p["scalers"]} or None
            trackers = {r: p["scalers"][0]["growth_tracker"] for r, p in points.items() if p["scalers"]} or None
        skipped = ({r: bool(p["skipped"]) for r, p in points.items()}
                   if any(p["skipped"] is not None for p in points.values()) else None)
        return Difference(_label(ref, has_join), ref["kind"], rank, ref_rank, parameter, scales, trackers,
                          skipped, {r: p["rank_step"] for r, p in points.items()},
                          {r: p.get("calls") or {} for r, p in points.items()}, _lrs_if_differ(points))
    return None


def _lrs_if_differ(points: dict[int, dict[str, Any]]) -> dict[int, list[float]] | None:
    lrs = {r: list(p.get("lrs") or []) for r, p in points.items()}
    return lrs if len({tuple(v) for v in lrs.values()}) > 1 else None


def _aligned(per_rank: dict[int, list[dict[str, Any]]]) -> Iterator[dict[int, dict[str, Any]]]:
    """Checkpoints side by side, in loop order: step i of block b on every rank that has it,
    then each Join's exit, then the end. A rank's tail steps (after its peers left Join) are
    compared among the ranks that ran them."""
    blocks = max((p["block"] for pts in per_rank.values() for p in pts), default=0)
    for block in range(blocks + 1):
        steps = {r: [p for p in pts if p["block"] == block and p["kind"] in STEPS]
                 for r, pts in per_rank.items()}
        for i in range(max((len(s) for s in steps.values()), default=0)):
            yield {r: s[i] for r, s in steps.items() if i < len(s)}
        yield {r: p for r, pts in per_rank.items() for p in pts
               if p["block"] == block and p["kind"] == "join-exit"}
    yield {r: p for r, pts in per_rank.items() for p in pts if p["kind"] == "end"}


def judge(results: list[dict[str, Any]]) -> MidRun:
    """Compare the ranks' checkpoints (``watch_loop``'s answers, in rank order)."""
    per_rank = {r: res["points"] for r, res in enumerate(results)}
    # The starts of training forwards are compared only where no rank stepped an optimizer.
    by_forward = not any(p["kind"] == "step" for pts in per_rank.values() for p in pts)
    if not by_forward:
        per_rank = {r: [p for p in pts if p["kind"] != "forward"] for r, pts in per_rank.items()}
    errors = {r: res["error"] for r, res in enumerate(results) if res.get("error")}
    has_join = any(p["kind"] == "join-exit" or p["block"] for pts in per_rank.values() for p in pts)
    compared = 0
    first = first_parameter = None
    end_params: bool | None = None
    end_scalers: bool | None = None
    for group in _aligned(per_rank):
        if len(group) < 2:
            continue
        compared += 1
        diff = _compare(group, has_join)
        if diff is not None and diff.parameter is not None and first_parameter is None:
            first_parameter = diff
        if diff is not None and first is None:
            first = diff
        if next(iter(group.values()))["kind"] == "end" and len(group) == len(results):
            ends = list(group.values())
            end_params = all(p["params"] == ends[0]["params"] for p in ends)
            end_scalers = all(p["scalers"] == ends[0]["scalers"] for p in ends)
    steps = {r: sum(p["kind"] in STEPS for p in pts) for r, pts in per_rank.items()}
    blocks = max((p["block"] for pts in per_rank.values() for p in pts), default=0)
    skipped = {r: [_label(p, has_join) for p in pts if p["skipped"]] for r, pts in per_rank.items()}
    return MidRun(compared, steps, (blocks + 1) // 2, first, first_parameter, end_params, end_scalers,
                  errors, {r: s for r, s in skipped.items() if s},
                  any(p["scalers"] for pts in per_rank.values() for p in pts), by_forward,
                  {r: res.get("calls") or {} for r, res in enumerate(results)})


def features(found: MidRun) -> dict[str, dict[str, Any]]:
    """The rows of the report's configuration table this look saw used (reports.keys.FEATURES,
    the format of ``conformance.harness.features``): the run_loop's GradScaler and Join."""
    out: dict[str, dict[str, Any]] = {}
    steps = ", ".join(f"rank {r} {n}" for r, n in sorted(found.steps_per_rank.items()))
    if found.scaled:
        out["grad_scaler"] = {"used": True, "value": "enabled in run_loop",
                              "where": f"run_loop's optimizer steps ({steps})"}
    if found.join_blocks:
        out["join"] = {"used": True, "value": f"{found.join_blocks} block(s) in run_loop",
                       "where": f"run_loop (optimizer steps per rank: {steps})"}
    return out


def _scales_text(d: Difference) -> str:
    if not d.scales:
        return ""
    scales = ", ".join(f"rank {r} {_number(s)}" for r, s in sorted(d.scales.items()))
    text = f"loss scales {scales}"
    if d.growth_trackers and len(set(d.growth_trackers.values())) > 1:
        text += ", growth trackers " + ", ".join(f"rank {r} {t}" for r, t in sorted(d.growth_trackers.items()))
    if d.skipped and len(set(d.skipped.values())) > 1:
        text += "; skipped the step (inf/NaN): " + ", ".join(
            f"rank {r} {'yes' if s else 'no'}" for r, s in sorted(d.skipped.items()))
    return text


def _number(value: float) -> str:
    if value > 0 and math.log2(value).is_integer():
        return f"{value:g} (2^{int(math.log2(value))})"
    return f"{value:g}"


def _steps_text(d: Difference) -> str:
    if len(set(d.rank_steps.values())) < 2:
        return ""
    return " (" + ", ".join(f"rank {r}'s step {s}" for r, s in sorted(d.rank_steps.items())) + " of the loop)"


def describe(found: MidRun) -> tuple[str, str]:
    """The failure message and the recommendation for a mid-run difference."""
    d = found.first
    assert d is not None
    shown = found.first_parameter or d
    parts = []
    if shown.parameter is not None:
        parts.append(f"at {shown.label}{_steps_text(shown)} parameter {shown.parameter!r} differs between "
                     f"rank {shown.reference_rank} and rank {shown.rank}")
        scales = _scales_text(shown)
        if scales:
            parts[-1] += f"; {scales}"
    if d is not shown or shown.parameter is None:
        what = "the GradScaler state" if d.parameter is None else f"parameter {d.parameter!r}"
        lead = "first " if parts else ""
        text = f"{what} {lead}differs at {d.label}{_steps_text(d)} (rank {d.reference_rank} vs rank {d.rank})"
        scales = _scales_text(d)
        parts.append(text + (f": {scales}" if scales else ""))
    if found.skipped and len({tuple(v) for v in found.skipped.values()} | ({()} if len(found.skipped) <
                                                                           len(found.steps_per_rank) else set())) > 1:
        parts.append("steps skipped on inf/NaN gradients differ: " + "; ".join(
            f"rank {r} at {', '.join(labels)}" for r, labels in sorted(found.skipped.items())))
    if found.end_params_agree and shown.parameter is not None and shown.kind != "end":
        parts.append("at the end of run_loop the parameters agree again on every rank"
                     + (" (Join re-synced the model at exit)" if found.join_blocks else "")
                     + ", so a look at the model after the loop sees nothing")
    # What some ranks did and others did not before the ranks parted (not under Join, whose
    # joined ranks shadow their peers' collectives and forwards by design).
    measured = [] if found.join_blocks else uneven(shown.calls)
    if measured:
        parts.append("before that checkpoint " + "; ".join(measured))
    if shown.lrs:
        parts.append("the learning rates differ there: " + ", ".join(
            f"rank {r} {'/'.join(f'{lr:g}' for lr in v)}" for r, v in sorted(shown.lrs.items())))
    message = "mid-run drift across ranks in run_loop: " + "; ".join(parts)
    scaler_cause = d.parameter is None or (shown.scales is not None and len(set(shown.scales.values())) > 1)
    if measured and not scaler_cause and calls_advice(shown.calls):
        rec = str(calls_advice(shown.calls))
    elif shown.lrs and not scaler_cause:
        rec = ("the learning rate changed on some ranks only (a scheduler stepped on a metric each rank "
               "computed from its own data, or on rank 0's evaluation alone): decide it from a value that is "
               "the same on every rank (all_reduce the metric first), or broadcast rank 0's decision")
    elif scaler_cause:
        rec = ("Keep the GradScaler state identical on every rank: with Join over uneven inputs only the "
               "ranks still training in Join's tail update their loss scale; after each Join load on every "
               "rank the scaler state of the rank that ran the most batches (the one Join takes the model "
               "from; all_gather_object the state_dicts), or give every rank the same number of batches")
    elif found.join_blocks:
        rec = ("Parameters differ while the scaler agrees: state outside the model advanced on some ranks "
               "only (optimizer momentum or moments over Join's tail, a rank-dependent learning rate); "
               "re-sync it after each Join or give every rank the same number of batches")
    else:
        rec = ("every backward that ends an accumulation window must synchronise, and nothing may change "
               "parameters outside optimizer.step() on one rank only")
    return message, rec
