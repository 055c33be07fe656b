"""The measured noise floor: how far two *mathematically equivalent* single-process runs of the
same target and configuration differ, and the bound a DDP difference is judged against.

Fixed per-dtype tolerances (``tensors.TOLERANCES``) are right for fp32 eager code and wrong
for everything noisier: bf16 autocast rounds every matmul to 8 mantissa bits, so a rank's
gradient on its shard and one process's on the whole batch differ by ~1e-3 of the gradient's
scale whatever DDP does (docs/numerics.md has the measurements). So the equivalence checks
measure the noise of *this* target in *this* configuration before judging DDP:

- **The twin.** On the reference's 1-rank world, after the N-rank run and only when one of
  its differences exceeds the fixed tolerance (within them, a floor that only ever widens them
  can change nothing: the record says "not needed"; a call of its own: ~10 ms of round trip,
  and each call stays within the check's per-call deadline), the target's own
  ``train_step`` runs once more on the same global batch — split into the N-rank run's N·K
  microbatches (rank by rank, in order: exactly the pieces the ranks compute on), accumulated
  in one process — and compares itself against the reference's snapshots exactly as the ranks
  do (``recording.run_recorded`` in role "compare" on world size 1). Mathematically it *is*
  the reference; numerically it computes every per-microbatch gradient as the ranks do and
  differs from the whole-batch run by the configuration's rounding alone. Its cost: one more
  single-process run of the check's steps on the global batch that compares every tensor at
  every step as a rank does (reading the snapshots back, a projection pass for the gradients),
  where the reference writes in the background: measured 1.9x the reference's call at 34 M
  parameters and 3.6x at 8 M (medians of 4 calls, a 2-core host shared with other test runs).
- **The floor.** For gradients: the largest twin difference relative to the tensor's own
  scale (``max|Δ| / max|ref|``; rounding is relative to the values rounded), over every compared
  tensor whose scale is not negligible (below 1e-4 of the largest: a conv bias before BatchNorm
  has a gradient of rounding noise only). For parameters: the largest *absolute* twin difference
  over every tensor and step. A parameter's noise is its update's, not a share of its value:
  AdamW moves every element by up to ~lr whatever its size, so a zero-initialised bias (scale
  1e-3 after a step) differs by as much as a weight of scale 0.5, and a relative floor set by
  the bias (measured 0.73 under bf16 autocast) would let the weights drift by 1.5 absolute.
  Taking the maximum over tensors makes both robust to a tensor where the twin happened to
  agree bit for bit (a small bias that rounds the same both ways): that tensor is still allowed
  the configuration's noise, not a zero one.
- **The bound.** A tensor's DDP difference passes within its fixed tolerance *or* within
  ``MARGIN × floor × max|ref|``. The margin covers that the N-rank run adds its own
  summation order on top of the same per-microbatch rounding (the twin has the same pieces, so
  the two are of one size; measured DDP/twin ratios are in docs/numerics.md).
- **Not a floor.** The twin measures noise only when splitting the batch is all that differs:
  it must step the optimizer and clip as often as the reference, and its gradients must be the
  reference's times 1 (each parameter's projected factor within ``FACTOR_SLACK`` of 1 — rounding
  moves a projection by far less). Otherwise the split changes what the step computes (a loss
  not divided by the number of microbatches, clipping inside the accumulation window, a step
  per microbatch): the floor is "not measured", said with the reason, and the fixed tolerances
  judge alone — exactly the suite's behaviour before the floor existed. The same holds when
  the loss is not a mean over samples (``hypotheses.split_weighting``: the twin measured the
  whole batch's loss, or its gradient with respect to the outputs, apart from its
  microbatches') and the twin's gradients differ from the reference's beyond their fixed
  tolerances: the twin then carries the N-rank run's weighting of the microbatches, and its
  difference is that weighting. No other twin measures this floor (the reordered one has the
  same pieces), so there is none (``_carries_weighting``). Likewise when the model mixes
  samples (``mixing``: a sample's outputs differed between the whole batch and its microbatches,
  measured in the same forwards) and the twin's gradients differ beyond their fixed tolerances:
  the twin computes the batch statistic over the ranks' samples, and its difference is that.
- **Too wide to judge.** When ``MARGIN × floor`` of the gradients reaches the relative error of
  the smallest scaling bug the check names (a loss scaled by N or K, or divided by them: a
  gradient factor f differs from the reference by ``|f - 1|`` of its scale), a passing
  comparison proves nothing: the check is inconclusive, "this configuration cannot distinguish
  …" with the numbers. Parameters never decide this: Adam normalises its update, so parameters
  barely show a scaling bug even in fp32; the gradients are the detector.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from .tensors import Compared, TensorDiff, fmt
from .hypotheses import NEGLIGIBLE, factors_by_name, measured_split, scale_from, split_weighting
from .mixing import Mixing
from .records import LossSplit
from .routing import NOT_NOISE

#: DDP difference allowed per unit of measured floor. The twin and the N-rank run round the
#: same per-microbatch gradients and differ only in how they sum them, so their differences
#: from the reference are of one size: measured DDP/twin ratios stay below 2
#: (benchmarks/noise_floor.py, docs/numerics.md); 4 leaves room for a noisier draw, and keeps
#: the bound of bf16 autocast (~1e-2) fifty times under the smallest scaling bug (0.5).
MARGIN = 4.0
#: How far from 1 a parameter's projected twin/reference factor may be while the twin still
#: counts as the same computation: rounding moves a projection by < 1e-2 even in bf16.
FACTOR_SLACK = 0.05
#: The record key of a twin that ran with its microbatches reversed (``twin``).
REORDERED = "reordered"
#: How far a half-precision step's own rounding moves the twin's gradients from the reference's:
#: bf16 autocast floors measured 3.7e-3 of a gradient's scale (docs/numerics.md), times MARGIN.
#: Below it a twin under autocast stays the floor even when the loss does not decompose
#: (``_carries_weighting``): a correct step normalised by the global count differs by that much.
HALF_ROUNDING = MARGIN * 3.7e-3


@dataclass(frozen=True, slots=True)
class Floor:
    """The twin's differences from the reference, reduced to one floor per kind of tensor."""

    grad_rel: float | None  # max |Δ|/max|ref| over gradients (None: not measured, see reason)
    param_abs: float | None  # max |Δ| over parameters and steps (absolute: an update's noise)
    twin_microbatches: int
    margin: float = MARGIN
    grad_tensor: str | None = None  # the tensor that set the floor
    param_tensor: str | None = None
    twin_factors: tuple[float, float] | None = None  # per-parameter twin/reference factors
    reason: str = ""  # why the floor was not measured
    # The twin in rank order was bit-identical to the reference (the step joins its
    # microbatches), so the floor comes from the twin with its microbatches reversed (``twin``).
    reordered: bool = False
    # Whether the loss decomposes as a mean over samples, measured by the twin (``hypotheses``),
    # and whether the twin carried that weighting (then the floor is not measured).
    loss_split: LossSplit | None = None
    weighting: bool = False
    # Per step, how far an adaptive optimizer's update rule lets two runs part per element
    # whatever their gradients (``adaptive.parameter_floor``; None: not Adam/AdamW).
    optimizer_abs: tuple[float, ...] | None = None
    # The twin ran past its deadline: no measurement at all (not a step that refuses the split).
    timed_out: bool = False
    # Where the model mixes samples (``mixing.Mixing.to_json``), when the twin carried it (then
    # the floor is not measured), and the twin's per-parameter gradient factors against the
    # reference (``hypotheses.factors_by_name``): the twin computes the statistic over the same
    # samples as the ranks, so the ranks' factors over the twin's show a scaling on top of it.
    mixing: dict[str, Any] | None = None
    twin_by_name: dict[str, tuple[float, float]] | None = None

    @property
    def measured(self) -> bool:
        return self.grad_rel is not None

    @property
    def grad_bound(self) -> float:
        return self.margin * self.grad_rel if self.grad_rel else 0.0

    @property
    def param_bound(self) -> float:
        """Absolute: margin x the parameters' floor."""
        return self.margin * self.param_abs if self.param_abs else 0.0

    def widen(self, diffs: list[TensorDiff], *, grad: bool, at_least: float = 0.0,
              step: int | None = None) -> list[TensorDiff]:
        """``diffs`` judged against the floor as well as their fixed tolerance: gradients within
        margin x floor of their scale, parameters within margin x floor absolute (expressed
        relative to each tensor's scale) or, after ``step`` under Adam/AdamW, within the update
        rule's own bound (``adaptive``), and anything within ``at_least`` of its scale (a comm
        hook's compression bound, ``compression``)."""
        param_abs = self.param_bound
        if not grad and step is not None and self.optimizer_abs and step < len(self.optimizer_abs):
            param_abs = max(param_abs, self.optimizer_abs[step])
        out = []
        for d in diffs:
            bound = self.grad_bound if grad else (param_abs / d.ref_max if d.ref_max > 0 else 0.0)
            bound = max(bound, at_least)
            out.append(replace(d, allowed_rel=bound) if bound > 0 else d)
        return out

    def indistinguishable(self, *, world_size: int, microbatches: int, random: bool = False) -> str | None:
        """Why a pass would prove nothing (the bound admits the smallest scaling bug), or None.
        ``random``: the forward draws random numbers, which is then what the floor measured,
        not rounding (the twin draws other values than the reference)."""
        if self.grad_bound <= 0:
            return None
        bug, what = smallest_bug(world_size=world_size, microbatches=microbatches)
        if self.grad_bound < bug:
            return None
        source = ("the random numbers its forward draws (with dropout off: N ranks and one process draw "
                  "other values)" if random else "its own rounding")
        return (f"this configuration cannot distinguish {what} (gradients off by {fmt(bug)} of "
                f"their scale) from {source}: two equivalent single-process runs (the "
                f"whole batch vs its {self.twin_microbatches} microbatches) already differ by "
                f"{fmt(self.grad_rel or 0.0)} of the scale of {self.grad_tensor!r}, and the bound "
                f"(margin {self.margin:g} x floor) is {fmt(self.grad_bound)}")

    def to_json(self) -> dict[str, Any]:
        return {"measured": self.measured, "reason": self.reason or None,
                "method": (f"the same train_step in one process on the global batch split into "
                           f"the N-rank run's {self.twin_microbatches} microbatches"
                           + (" in reverse order (in rank order it was bit-identical to the "
                              "reference: the step joins its microbatches, so only another "
                              "summation order shows the rounding)" if self.reordered else "")
                           + ", against the whole-batch reference"),
                "reordered": self.reordered, "timed_out": self.timed_out,
                "twin_microbatches": self.twin_microbatches, "margin": self.margin,
                "loss_split": dict(self.loss_split) if self.loss_split else None,
                "loss_weighting": self.weighting, "mixing": self.mixing,
                "twin_factor_range": list(self.twin_factors) if self.twin_factors else None,
                "gradients": {"floor_rel": self.grad_rel, "tensor": self.grad_tensor,
                              "bound_rel": self.grad_bound},
                "parameters": {"floor_abs": self.param_abs, "tensor": self.param_tensor,
                               "bound_abs": self.param_bound,
                               "optimizer_bound_abs": list(self.optimizer_abs) if self.optimizer_abs else None}}


def smallest_bug(*, world_size: int, microbatches: int) -> tuple[float, str]:
    """(relative gradient error, description) of the least visible scaling bug named by the
    checks (``hypotheses.scale_causes``): a gradient factor f is off by |f - 1| of its scale."""
    n, k = world_size, microbatches
    table = [(abs(n - 1), f"a loss multiplied by the world size (factor N={n})"),
             (abs(1 - 1 / n), f"a loss divided by the world size or summed (factor 1/{n})")]
    if k > 1:
        table += [(abs(k - 1), f"a loss not divided by the K={k} accumulation steps (factor {k})"),
                  (abs(1 - 1 / k), f"a loss divided by K={k} twice (factor 1/{k})")]
    return min(table)


def _largest(compared: list[Compared]) -> tuple[float, str | None]:
    """(max relative difference, its tensor) over tensors of non-negligible scale."""
    both = [c for c in compared if c.got_present and c.ref_present]
    top = max((c.diff.ref_max for c in both), default=0.0)
    rel, name = 0.0, None
    for c in both:
        if c.diff.ref_max > NEGLIGIBLE * top and not c.diff.max_rel <= rel:
            rel, name = c.diff.max_rel, c.name
    return rel, name


def not_measured(reason: str, *, twin_microbatches: int) -> Floor:
    return Floor(None, None, twin_microbatches, reason=reason)


#: The floor's record when no twin ran: every difference was within its fixed tolerance.
NOT_NEEDED = ("not needed: every tensor matched the single-process reference within its fixed "
              "dtype tolerance, which already tells the smallest scaling bug from rounding")


def _carries_weighting(twin: dict[str, Any], split: LossSplit | None) -> str | None:
    """Does the twin carry a per-microbatch weighting of the loss? Measured twice: the loss does
    not decompose as a mean over samples (``hypotheses.split_weighting``), and the twin's
    gradients differ from the reference's beyond their fixed tolerances (its worst one, in
    words), or None.

    The twin accumulates per-microbatch losses exactly as the ranks do, so it carries the same
    weighting: its difference from the reference is that weighting, a systematic error, and a
    floor set by it would pass the very deviation the check measures (and any bug smaller than
    it). The reordered twin (same pieces) carries it too: no floor, the fixed tolerances judge
    alone. The gradients decide because the measurement is of ``forward_loss``/``loss_fn``: a
    ``train_step`` that renormalises by the global count computes the reference's gradients
    from the same per-microbatch losses, and its twin is a floor like any other (AdamW's
    last-bit parameter noise needs it: pytorch/examples' language_translation, normalised by
    the global count, differs by 7e-5 in its parameters after a step). Under autocast the
    twin's rounding reaches ``HALF_ROUNDING`` of the gradients' scale whatever the loss: only a
    difference beyond it is taken for the weighting."""
    if not split_weighting(split):
        return None
    assert split is not None
    return _twin_beyond(twin, split)


def _twin_beyond(twin: dict[str, Any], split: LossSplit) -> str | None:
    """The twin's worst gradient difference from the reference beyond its fixed tolerance (and,
    under autocast, beyond ``HALF_ROUNDING``), in words, or None."""
    # Under autocast the twin's rounding alone goes beyond the fixed tolerances.
    least = HALF_ROUNDING if "autocast" in (twin.get("features") or {}) or split["half"] else 0.0
    compared: list[Compared] = [*(twin.get("grads0") or []), *(twin.get("pre_clip0") or [])]
    beyond = [c.diff for c in compared if c.got_present and c.ref_present
              and not (c.diff.ratio <= 1.0 or c.diff.max_rel <= least)]
    if not beyond:
        return None
    top = max(beyond, key=lambda d: d.max_rel)
    return f"gradient of {top.name!r} by {fmt(top.max_rel)} of its scale"


def _norms(norms: dict[str, Any] | None) -> list[float]:
    return [float(v) for v in (norms or {}).values() if v is not None]


def twin_floor(reference: dict[str, Any], twin: dict[str, Any] | None, *,
               twin_microbatches: int) -> Floor:
    """The floor from the twin's summaries, or why the twin is no measurement of noise (None:
    no twin ran, because no difference needed a floor)."""
    def no(reason: str) -> Floor:
        return not_measured(reason, twin_microbatches=twin_microbatches)

    if twin is None:
        return no(NOT_NEEDED)
    if twin.get("failed") and twin.get("timed_out"):
        return replace(no(f"the same train_step on {twin_microbatches} microbatches in one process did "
                          f"not finish within the deadline ({twin['failed']}): no measurement"),
                       timed_out=True)
    if twin.get("failed"):
        return no(f"the same train_step on {twin_microbatches} microbatches in one process raised "
                  f"({twin['failed']}): the step does not take that split")
    # Randomness left in forward moves the pieces' losses too: no measurement then.
    split: LossSplit | None = None if twin.get("rng_in_forward") else twin.get("loss_split")
    weighted = _carries_weighting(twin, split)
    if weighted is not None:
        assert split is not None
        return replace(no(
            f"the loss is not a mean over samples: {measured_split(split)}; and the run on "
            f"{twin_microbatches} microbatches differs from the whole-batch run beyond the fixed "
            f"tolerances ({weighted}): by the loss's weighting of the microbatches, not by rounding"),
            loss_split=split, weighting=True)
    mixing = split.get("mixing") if split is not None else None
    beyond = _twin_beyond(twin, split) if split is not None and mixing else None
    if mixing and beyond is not None:
        # The twin's microbatches are the ranks' pieces: it computes the batch statistic over
        # the same samples as the ranks, so its difference from the whole batch is the mixing.
        return replace(no(
            f"{Mixing.from_json(mixing).where()} for a sample depend on the other samples of its batch, "
            f"and the run on {twin_microbatches} microbatches differs from the whole-batch run beyond "
            f"the fixed tolerances ({beyond}): by the statistic over other samples, not by rounding"),
            loss_split=split, mixing=mixing,
            twin_by_name=factors_by_name([twin.get("grads0") or []], _norms(reference.get("grads0"))))
    if twin.get(NOT_NOISE):  # ``routing.trim_twin``: its top-k routing flipped
        return no(str(twin[NOT_NOISE]))
    if twin.get("nonfinite") or reference.get("nonfinite"):
        return no("a run produced NaN/Inf: no noise to measure")
    if twin.get("optimizer_steps") != reference.get("optimizer_steps"):
        return no(f"train_step stepped the optimizer {twin.get('optimizer_steps')} times per "
                  f"step on {twin_microbatches} microbatches but {reference.get('optimizer_steps')} "
                  f"on the whole batch: the split changes what a step does")
    if twin.get("grads0_step") != reference.get("grads0_step"):
        return no(f"the first optimizer.step() ran at step {twin.get('grads0_step')} on "
                  f"{twin_microbatches} microbatches but at {reference.get('grads0_step')} on the "
                  f"whole batch (a GradScaler skipped a step on one side only)")
    clips = [len(c) for c in twin.get("clip_calls") or []]
    ref_clips = [len(c) for c in reference.get("clip_calls") or []]
    if clips != ref_clips:
        return no(f"clip_grad_norm_ ran {clips} times per step on {twin_microbatches} microbatches "
                  f"but {ref_clips} on the whole batch: clipping inside the accumulation window "
                  f"depends on the split")
    grads: list[Compared] = twin.get("grads0") or []
    if not grads:
        return no("no gradient reached the optimizer in the twin run")
    # At optimizer.step() and, when the step clips, before clipping: an engaged clip rescales
    # both runs to max_norm and would hide a factor that the unclipped gradients show.
    factors: tuple[float, float] | None = None
    for label in ("grads0", "pre_clip0"):
        got: list[Compared] = twin.get(label) or []
        ref_norms = [float(v) for v in (reference.get(label) or {}).values() if v is not None]
        scale = scale_from([got], ref_norms)
        if not scale.parameters:
            continue
        factors = (min(scale.low, factors[0]), max(scale.high, factors[1])) if factors else (scale.low, scale.high)
    if factors and max(abs(factors[0] - 1), abs(factors[1] - 1)) > FACTOR_SLACK:
        return replace(no(
            f"the gradients of the run on {twin_microbatches} microbatches are the whole-batch "
            f"run's times {factors[0]:.3g}..{factors[1]:.3g}, not 1: the step's result depends on "
            f"how the batch is split (e.g. a loss not divided by the number of microbatches)"),
            twin_factors=factors)
    grad_rel, grad_name = _largest([*grads, *(twin.get("pre_clip0") or [])])
    params = [c for step in twin.get("params") or [] for c in step if c.got_present and c.ref_present]
    top = max(params, key=lambda c: c.diff.max_abs, default=None)
    return Floor(grad_rel, top.diff.max_abs if top else 0.0, twin_microbatches, grad_tensor=grad_name,
                 param_tensor=top.name if top else None, twin_factors=factors,
                 reordered=bool(twin.get(REORDERED)), loss_split=split)
