"""The scaling cliff, measured and predicted: one link rate's numbers, the knee, the projection.

Pure maths over what ``rank.link_point`` measured on every rank at each rate of a
sweep (docs/ddp-background.md, "Scaling cliffs"): a bucket's all-reduce can start only once its
last gradient is ready on *every* rank, so the profile the simulator is given is the
per-gradient latest of the ranks' side-by-side no-DDP passes; each rate gets its own alpha-beta
fit from the all-reduce sweep measured under the same shaping; the simulator
(:func:`~conformance.perf.maths.simulator.step_at`) overlaps DDP's own bucket layout with that
backward.

The knee is the fastest rate of the sweep at which the communication the shaping exposes (the
step minus the side-by-side compute, DDP's fixed cost and what was exposed unshaped already)
exceeds :data:`KNEE_SHARE` of the compute: above it the link hides behind backward, below it
every halving of the rate shows in the step time (:func:`knees`).

    >>> knee_index([0.010, 0.0105, 0.011, 0.016, 0.030], [0.010] * 5)
    3
"""

from __future__ import annotations

import contextlib
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..maths import AlphaBeta, BackwardProfile, ddp_bucket_caps, fit_alpha_beta, greedy_buckets
from ..measure import parse_bucket_indices
from .shaped_link import HookTraffic, ShapedLink, burst_credit_s

# HookTraffic, ShapedLink and burst_credit_s are re-exported: the judge and its tests reach them here.
__all__ = ["CliffReport", "HookTraffic", "LinkPoint", "ShapedLink", "UnfittableRate", "burst_credit_s",
           "combined_profile", "fit_point", "link_point", "measured_step", "median_report", "rate_text",
           "sweep_report", "validate"]

#: Exposed communication above this share of the compute marks the knee (measured and
#: predicted alike). A quarter: well above the step-to-step noise of a loaded 2-core host
#: (a few per cent on the medians), well below the doubling the sweep's lowest rate reaches.
KNEE_SHARE = 0.25
#: Where in its distribution a step (and its compute) is read: :func:`measured_step`.
STEP_QUANTILE = 0.25
#: The simulator's bound at every shaped rate of the sweep: above it a projection is marked
#: unvalidated rather than shown as a result.
ERROR_BOUND = 0.15


@dataclass(frozen=True, slots=True)
class LinkPoint:
    """One rate of the sweep, measured and predicted (seconds; ``rate_bits_per_s`` None: unshaped)."""

    rate_bits_per_s: float | None
    measured_step_s: float
    predicted_step_s: float
    compute_s: float  # forward + backward without DDP, side by side with the DDP steps
    alpha_s: float
    beta_bytes_per_s: float
    fit_residual: float
    buckets: int
    ddp_comm_s: float | None = None  # DDP's own backward communication time (its logging)
    overhead_s: float = 0.0  # DDP's fixed per-step cost included in the prediction (``validate``)
    # What the prediction is simulated from, so that ``validate`` can simulate it again once
    # DDP's fixed cost is known (the link's token bucket refills during that cost too).
    link: ShapedLink | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.measured_step_s <= 0 or self.predicted_step_s <= 0:
            raise ValueError(f"step times {self.measured_step_s}, {self.predicted_step_s} must be positive")

    @property
    def error(self) -> float:
        """|predicted - measured| / measured."""
        return abs(self.predicted_step_s - self.measured_step_s) / self.measured_step_s

    @property
    def measured_exposed_s(self) -> float:
        """The step less its compute and DDP's fixed cost: communication that did not hide."""
        return max(0.0, self.measured_step_s - self.compute_s - self.overhead_s)

    @property
    def predicted_exposed_s(self) -> float:
        return max(0.0, self.predicted_step_s - self.compute_s - self.overhead_s)

    def to_metric(self) -> dict[str, float | int | None]:
        return {"rate_gbps": None if self.rate_bits_per_s is None else self.rate_bits_per_s / 1e9,
                "measured_step_s": self.measured_step_s, "predicted_step_s": self.predicted_step_s,
                "compute_s": self.compute_s, "measured_exposed_s": self.measured_exposed_s,
                "predicted_exposed_s": self.predicted_exposed_s, "error": round(self.error, 4),
                "alpha_s": self.alpha_s, "beta_bytes_per_s": self.beta_bytes_per_s,
                "fit_residual": round(self.fit_residual, 4), "buckets": self.buckets,
                "ddp_comm_s": self.ddp_comm_s, "overhead_s": self.overhead_s}


def quartile(values: Sequence[float]) -> float:
    """The lower quartile (:data:`STEP_QUANTILE`) of ``values`` (the value itself for one)."""
    ordered = sorted(values)
    if len(ordered) < 2:
        return ordered[0]
    return statistics.quantiles(ordered, n=4, method="inclusive")[0]


def synchronized(per_rank: Sequence[Mapping[str, Any]], key: str) -> float:
    """Lower quartile over passes of the slowest rank's time in that pass.

    In a training loop every step's all-reduce waits for the last rank, so what the step
    pays is each step's slowest compute (two ranks' noise, the worse of the two every time).
    The same statistic as the measured steps (:func:`measured_step`): compute and step are
    compared at the same point of their distributions."""
    return quartile([max(times) for times in zip(*(r[key] for r in per_rank))])


def combined_profile(per_rank: Sequence[Mapping[str, Any]]) -> tuple[BackwardProfile, list[int]]:
    """(the profile in backward order, the parameter index at each position) from every rank's
    no-DDP passes: per gradient the latest rank (a collective starts when its last rank joins),
    forward and backward the passes' synchronized times (:func:`synchronized`), the ready
    times scaled to that backward."""
    nbytes = list(per_rank[0]["nbytes"])
    backward = synchronized(per_rank, "backward")
    latest = max(r["backward_end_s"] for r in per_rank)
    scale = backward / latest if latest > 0 else 1.0
    ready = [scale * max(r["ready_s"][i] for r in per_rank) for i in range(len(nbytes))]
    order = sorted(range(len(nbytes)), key=lambda i: (ready[i], -i))
    names = list(per_rank[0]["names"])
    profile = BackwardProfile(ready_s=tuple(ready[i] for i in order), nbytes=tuple(nbytes[i] for i in order),
                              backward_end_s=backward, forward_s=synchronized(per_rank, "forward"),
                              names=tuple(names[i] for i in order))
    return profile, order


def bucket_layout(profile: BackwardProfile, order: Sequence[int], logging: Mapping[str, Any],
                  cap_mb: float | None) -> list[list[int]]:
    """Buckets as positions in ``profile``: DDP's rebuilt layout where it logged one, else DDP's
    greedy rule over the profile's order."""
    position = {param: pos for pos, param in enumerate(order)}
    ddp = parse_bucket_indices(str(logging.get("rebuilt_per_bucket_param_indices", "") or ""))
    if ddp and all(i in position for b in ddp for i in b):
        return [[position[i] for i in b] for b in ddp]
    first, cap = ddp_bucket_caps(cap_mb)
    return greedy_buckets(profile.nbytes, cap, first_cap_bytes=first)


def quartile_of_slowest(per_rank_times: Sequence[Sequence[float]]) -> float:
    """Lower quartile over iterations of the slowest rank's time in that iteration: one
    message size's all-reduce time, read where the step (:func:`measured_step`) and the
    compute (:func:`synchronized`) are read.

    Not the median: the sweep's timings are as bimodal as the steps (measured on a quiet
    2-core host: a 864-byte all-reduce took 0.3-0.5 ms, or 3-4 ms when a rank's thread missed
    a time slice, in 2 of 6 iterations or in 4), so a median of six put a whole time slice
    into one size's time in some rates and not in others -- the fitted latency then scattered
    126-743 us between repeats of the same rate, and the predicted step with it."""
    return quartile([max(times) for times in zip(*per_rank_times)])


def fit_point(sizes: Sequence[int], per_rank_times: Sequence[Sequence[Sequence[float]]], world_size: int, *,
              unshaped: bool = False, rate_bits_per_s: float | None = None) -> AlphaBeta:
    """The alpha-beta fit of one rate's sweep (per size: :func:`quartile_of_slowest`).

    ``rate_bits_per_s``: the shaped rate. A size whose all-reduce took less time than the rate
    needs for its bytes (``2(N-1) M`` through the one shaped loopback) was paid by the link's
    burst, refilled in the gaps between back-to-back calls, not by the rate: the fit leaves it
    out (when two sizes remain and fit a line), since the model pays the burst separately
    (``ShapedLink``).
    Measured (karpathy/pytorch-made's MADE, 3 MB of gradients, 2 Gbit/s = 250 MB/s): 64 KiB
    all-reduced in 0.30 ms, 1 and 4 MB at the link's rate, and the fit through all of them read
    200 MB/s where the link allows 125; its slowest rates were predicted 11-20 % fast.

    ``unshaped``: on the unshaped loopback the whole sweep takes about a millisecond and a busy
    host's scheduling noise can tilt the line below flat; there the all-reduce is a sliver of
    the step, so instead of giving up, the smallest size's time is the latency and the
    largest size's throughput the bandwidth (the fit's own weakest reading, stated as such by
    ``intercept_clamped``). A shaped rate's fit never falls back: its slope is the link."""
    times = [quartile_of_slowest([rank[i] for rank in per_rank_times]) for i in range(len(sizes))]
    if rate_bits_per_s:
        paid_by_rate = [i for i, (size, t) in enumerate(zip(sizes, times))
                        if t >= 2 * (world_size - 1) * size * 8 / rate_bits_per_s]
        if len(paid_by_rate) >= 2:
            with contextlib.suppress(ValueError):  # what is left is noise: the whole sweep decides
                return fit_alpha_beta([sizes[i] for i in paid_by_rate], [times[i] for i in paid_by_rate],
                                      world_size)
    try:
        return fit_alpha_beta(sizes, times, world_size)
    except ValueError:
        if not unshaped or min(times) <= 0:
            raise
    n = world_size
    return AlphaBeta(alpha_s=times[0] / (2 * (n - 1)), beta_bytes_per_s=2 * (n - 1) / n * sizes[-1] / times[-1],
                     fit_world_size=n, median_rel_residual=1.0, intercept_clamped=True)


def link_point(rate: float | None, values: Sequence[Mapping[str, Any]], sizes: Sequence[int],
               cap_mb: float | None) -> LinkPoint:
    """One rate's LinkPoint from every rank's ``rank.link_point`` value."""
    n = len(values)
    profile, order = combined_profile([v["profile"] for v in values])
    fit = fit_point(sizes, [v["sweep"]["times"] for v in values], n, unshaped=rate is None, rate_bits_per_s=rate)
    layout = bucket_layout(profile, order, values[0]["logging"], cap_mb)
    link = ShapedLink.of(profile, layout, fit, n, burst_credit_s(rate),
                         buffer_bytes=int(values[0].get("buffer_bytes", 0)),
                         buffer_messages=int(values[0].get("buffer_messages", 1)), between_s=between_steps(values),
                         hook=HookTraffic(**values[0]["hook_traffic"]) if values[0].get("hook_traffic") else None,
                         skew_s=launch_skew(values))
    comm = [v["logging"].get("avg_backward_comm_time") for v in values]
    ddp_comm = statistics.median(c * 1e-9 for c in comm) if all(isinstance(c, (int, float)) and c > 0
                                                               for c in comm) else None
    return LinkPoint(rate_bits_per_s=rate, measured_step_s=measured_step(values),
                     predicted_step_s=link.step_s(0.0),
                     compute_s=profile.forward_s + profile.backward_end_s, alpha_s=fit.alpha_s,
                     beta_bytes_per_s=fit.beta_bytes_per_s, fit_residual=fit.median_rel_residual,
                     buckets=len(layout), ddp_comm_s=ddp_comm, link=link)


def launch_skew(values: Sequence[Mapping[str, Any]]) -> float:
    """How much earlier the first rank readies its gradients than the last one, in a typical
    timed DDP step: per step the spread over ranks of the watched gradient's readiness
    (``rank.FirstGradient``), median over steps. The early rank's share of an
    all-reduce goes on the link as soon as it is ready, so the link's token bucket stops
    refilling that much before the all-reduce the simulator starts at the last rank's readiness.

    Measured (examples/train_resume.py, one 848-byte bucket at 25.8 Mbit/s, where the refilled
    burst just covers its all-reduce; timed with a comm hook): the link idled 0.60-0.72 ms from
    the later rank's end of one all-reduce to the earlier rank's start of the next (medians per
    run) where the model counted 0.8 ms, the ranks starting 0.08-0.21 ms apart, and the step was
    predicted 15-17 % fast. The watched gradient's spread reads ~0.05 ms there (per-rate
    medians 0.045-0.066 ms); with it, re-judging the same 21 sweeps, train_resume went from
    0.148 to 0.117 and the mlp from 0.098 to 0.070, no configuration worse. A sweep saved
    before the readiness was recorded: the spread of the plain passes (forward + backward)."""
    firsts = [v.get("first_ready") for v in values]
    if all(firsts) and len(values) > 1:
        spreads = [max(t) - min(t) for t in zip(*firsts) if None not in t]
        if spreads:
            return statistics.median(spreads)
    totals = [[f + b for f, b in zip(v["profile"]["forward"], v["profile"]["backward"])] for v in values]
    return max(0.0, quartile([max(t) for t in zip(*totals)]) - quartile([min(t) for t in zip(*totals)]))


def between_steps(values: Sequence[Mapping[str, Any]]) -> float:
    """How long the link idled between two timed steps (the rank's plain pass and the wait that
    lines the ranks up again, off the network: ``host_barrier``): per step the later rank's
    gap (the link carries the step's last bytes until that rank returns), median over steps.
    A sweep saved before the gaps were recorded: the plain pass alone (forward + backward of
    the profile)."""
    if all(v.get("gaps") for v in values):
        return statistics.median(min(gaps) for gaps in zip(*(v["gaps"] for v in values)))
    profiles = [v["profile"] for v in values]
    return synchronized(profiles, "forward") + synchronized(profiles, "backward")


def measured_step(values: Sequence[Mapping[str, Any]]) -> float:
    """The lower quartile over steps of the slowest rank's time in that step.

    The slowest rank, because behind a shaped link the ranks do not end a step together:
    gloo's ring returns on a rank once it has received its peer's all-gather chunk, while its
    own chunk to the peer may still be queued behind the link. Measured (tied-lm, 2 ranks,
    17 Mbit/s): in every step one rank returned 4-7 ms before the other (half an all-gather
    is 7 ms there), which rank alternating; unshaped, both returned within 0.1 ms. A training
    loop's next all-reduce waits for the later rank, so the step the loop pays -- and the one
    the simulator predicts -- is the later rank's. Pooling both ranks' steps instead picked
    the early rank at slow rates: the predictions were 6-19 % high there on every target.

    Why the lower quartile, not the median: on a shared host the step times are bimodal.
    Measured on a 2-core host at load 11 (tied-lm, 12 steps per rate, 3 repeats): the lower
    quartile of the unshaped step was 4.4-4.8 ms in all 21 unshaped measurements while the
    upper quartile ran from 4.5 to 21 ms -- a thread of a rank (the gloo worker, or the main
    thread woken from its wait) that is not scheduled for a time slice costs a whole slice.
    The median lands on whichever mode holds half the steps that second; the lower quartile
    is the step this link and this model take when the host lets them, which is what the
    simulator models. The compute (:func:`synchronized`) and the all-reduce sweep
    (:func:`quartile_of_slowest`) are read at the same point of their distributions."""
    return quartile([max(times) for times in zip(*(v["step_times"] for v in values))])


def knee_index(steps: Sequence[float], compute: Sequence[float]) -> int | None:
    """Index of the first point (rates in descending order) whose exposed communication
    exceeds KNEE_SHARE of its compute; None when the whole sweep stays hidden."""
    for i, (step, comp) in enumerate(zip(steps, compute)):
        if step - comp > KNEE_SHARE * comp:
            return i
    return None


#: The all-reduce sweep of each rate reaches the size whose transfer takes this long at that
#: rate (at least twice the model's gradients): below it a loopback's latency noise decides
#: the slope, and the fit would be of noise.
FIT_SPAN_S = 0.004
#: What "unshaped" is taken to carry, for sizing its sweep: a namespace loopback measured ~3-5 Gbit/s.
UNSHAPED_BITS_PER_S = 5e9
MAX_FIT_BYTES = 4 << 20


def fit_sizes(total_bytes: int, rate_bits_per_s: float | None) -> list[int]:
    """Message sizes (bytes, multiples of 4, ascending) for one rate's alpha-beta fit."""
    rate = rate_bits_per_s or UNSHAPED_BITS_PER_S
    top = min(max(2 * total_bytes, int(rate * FIT_SPAN_S / 8)), MAX_FIT_BYTES)
    size, sizes = max(min(total_bytes // 8, 4096), 64), []
    while size < top:
        sizes.append(size // 4 * 4)
        size *= 4
    return sorted({*sizes, top // 4 * 4})


def sweep_rates(total_bytes: int, compute_s: float, world_size: int, *,
                exposures: Sequence[float]) -> list[float]:
    """Link rates (bits/s, descending) at which all-reducing ``total_bytes`` would take each of
    ``exposures`` times ``compute_s``. Every rank's share crosses the one shaped loopback, so
    an all-reduce carries ``2(N-1)/N`` of the bytes per rank, N ranks together."""
    carried = 2 * (world_size - 1) * total_bytes * 8
    return [max(carried / (share * compute_s), 1e5) for share in sorted(exposures)]


@dataclass(frozen=True, slots=True)
class CliffReport:
    """The sweep judged: ``points[0]`` is the unshaped link (medians of its measurements), then
    the shaped rates in descending order, each prediction including DDP's fixed per-step cost
    as measured on the unshaped link right before and after that rate (``overhead_s``)."""

    points: tuple[LinkPoint, ...]
    unshaped_drift: float  # (max - min) / min of the unshaped steps measured through the sweep
    measured_index: int | None
    predicted_index: int | None

    @property
    def shaped(self) -> tuple[LinkPoint, ...]:
        return self.points[1:]

    @property
    def rates(self) -> tuple[float, ...]:
        """The shaped rates, descending (bits/s)."""
        return tuple(p.rate_bits_per_s or 0.0 for p in self.shaped)

    @property
    def overhead_s(self) -> float:
        """DDP's fixed per-step cost on the unshaped link (median of its calibrations)."""
        return self.points[0].overhead_s

    @property
    def cliff_ratio(self) -> float:
        """The lowest rate's step over the unshaped one."""
        return self.points[-1].measured_step_s / self.points[0].measured_step_s

    @property
    def max_error(self) -> float:
        return max(p.error for p in self.shaped)

    @property
    def knee_agrees(self) -> bool:
        """The predicted knee within one sweep point of the measured (or both absent)."""
        if self.measured_index is None or self.predicted_index is None:
            return self.measured_index == self.predicted_index
        return abs(self.measured_index - self.predicted_index) <= 1

    @property
    def validated(self) -> bool:
        return bool(self.shaped) and self.max_error <= ERROR_BOUND and self.knee_agrees

    def knee(self, index: int | None) -> float | None:
        return None if index is None else self.points[index].rate_bits_per_s

    @property
    def measured_knee(self) -> float | None:
        return self.knee(self.measured_index)

    @property
    def predicted_knee(self) -> float | None:
        return self.knee(self.predicted_index)

    def notes(self) -> list[str]:
        out = [f"DDP's fixed per-step cost (hooks, bucket copies, thread hand-offs: the unshaped step "
               f"minus the simulated one) is measured on the unshaped link before, between and after the "
               f"shaped rates and its median added to every prediction ({self.overhead_s * 1e3:.2f} ms); "
               f"the shaped rates are the validation"]
        if self.unshaped_drift > ERROR_BOUND:
            out.append(f"the unshaped step varied {self.unshaped_drift:.0%} through the sweep: the "
                       f"host's load changed while it ran")
        bad = [p for p in self.shaped if p.error > ERROR_BOUND]
        if bad:
            out.append(f"{len(bad)} of {len(self.shaped)} shaped rates predicted outside {ERROR_BOUND:.0%}: "
                       + ", ".join(f"{(p.rate_bits_per_s or 0) / 1e6:.3g} Mbit/s {p.error:.0%}" for p in bad))
        return out


def validate(points: Sequence[LinkPoint]) -> CliffReport:
    """Judge a sweep measured in sweep order, the unshaped link between every two shaped rates
    (and first and last): [unshaped, rate 1, unshaped, rate 2, ..., unshaped], rates descending.

    Each shaped rate's prediction gets DDP's fixed cost (measured minus simulated, never below
    0) as the median over all the sweep's unshaped calibrations, spread through it. It is one
    quantity (DDP's hooks, copies and hand-offs on this model), and each calibration a noisy
    reading of it: on a quiet host, consecutive unshaped steps of the mlp (a 1 ms step) read
    1.0, 2.0, 1.7, 2.5, 2.6, 1.5 ms -- a time slice more or less -- so the median of a rate's
    two neighbours (what was used before) moved a prediction by up to half a step; the sweep's
    median of eight does not. A load change during the sweep still shows in the compute (read
    beside every step) and is reported (``unshaped_drift``)."""
    if len(points) < 3 or len(points) % 2 == 0 or any(
            (p.rate_bits_per_s is None) != (i % 2 == 0) for i, p in enumerate(points)):
        raise ValueError(f"a sweep is [unshaped, rate, unshaped, ..., unshaped]; got rates "
                         f"{[p.rate_bits_per_s for p in points]}")

    def cost(p: LinkPoint) -> float:
        return max(0.0, p.measured_step_s - p.predicted_step_s)

    unshaped = points[0::2]
    # The unshaped link's latency: software alone, at every rate. What a shaped rate's fit adds
    # to it is bytes on the link, which the burst pays for (ShapedLink.with_unshaped_latency).
    software_alpha = statistics.median(p.alpha_s for p in unshaped)
    # And its bandwidth is the line rate a burst crosses at (ShapedLink.at_line_rate).
    line_beta = statistics.median(p.beta_bytes_per_s for p in unshaped)

    def simulated(p: LinkPoint, overhead: float) -> float:
        # Simulated again with the fixed cost: the link's bucket refills during it too.
        if p.link is None:
            return p.predicted_step_s + overhead
        link = p.link.with_unshaped_latency(software_alpha).at_line_rate(p.beta_bytes_per_s, line_beta)
        return link.step_s(overhead)

    fixed = statistics.median(cost(p) for p in unshaped)
    shaped = [replace(p, overhead_s=fixed, predicted_step_s=simulated(p, fixed)) for p in points[1::2]]
    shaped.sort(key=lambda p: -(p.rate_bits_per_s or 0.0))
    base = replace(unshaped[0], measured_step_s=statistics.median(p.measured_step_s for p in unshaped),
                   compute_s=statistics.median(p.compute_s for p in unshaped), overhead_s=fixed,
                   predicted_step_s=statistics.median(p.predicted_step_s for p in unshaped) + fixed)
    steps = [p.measured_step_s for p in unshaped]
    calibrated = (base, *shaped)
    # The knee is judged against the compute *plus* DDP's fixed cost: that cost is no exposed
    # communication, it is there on the fastest link too.
    measured, predicted = knees(calibrated)
    return CliffReport(points=calibrated, unshaped_drift=(max(steps) - min(steps)) / min(steps),
                       measured_index=measured, predicted_index=predicted)


def median_report(runs: Sequence[CliffReport]) -> CliffReport:
    """Several sweeps at the same rates judged as one: per rate the median measured and predicted
    step (and compute, fixed cost, fit) over the sweeps, the knees found again on those.

    One sweep on a small shared host is mostly its noise at the fast rates (a single sweep's
    error there is +-20-30 %, centred on zero: measured over 21 sweeps of tied-lm on a 2-core
    host, validated by 7 single sweeps of 21 and by 6 of 7 medians of three)."""
    if len(runs) == 1:
        return runs[0]
    rates = runs[0].rates
    if any(r.rates != rates for r in runs):
        raise ValueError("sweeps judged together must be at the same rates")

    def med(i: int, key: str) -> float:
        return statistics.median(getattr(r.points[i], key) for r in runs)

    points = tuple(replace(p, measured_step_s=med(i, "measured_step_s"), predicted_step_s=med(i, "predicted_step_s"),
                           compute_s=med(i, "compute_s"), overhead_s=med(i, "overhead_s"), alpha_s=med(i, "alpha_s"),
                           beta_bytes_per_s=med(i, "beta_bytes_per_s"))
                   for i, p in enumerate(runs[0].points))
    measured, predicted = knees(points)
    return CliffReport(points=points, unshaped_drift=statistics.median(r.unshaped_drift for r in runs),
                       measured_index=measured, predicted_index=predicted)


def rate_text(rate: float | None) -> str:
    """``rate`` (bits/s) as the report says it; None is the unshaped link."""
    if rate is None:
        return "unshaped"
    return f"{rate / 1e9:.3g} Gbit/s" if rate >= 1e9 else f"{rate / 1e6:.3g} Mbit/s"


class UnfittableRate(ValueError):
    """A rate's all-reduce timings could not be fitted in any sweep."""

    def __init__(self, rate: float | None, reason: str, points: Sequence[LinkPoint]) -> None:
        super().__init__(reason)
        self.rate, self.reason, self.points = rate, reason, tuple(points)


def sweep_report(sweeps: Sequence[Any]) -> tuple[CliffReport, list[str]]:
    """(the sweeps -- ``scaling_cliff.SweepData``, all at the same rates -- judged by their
    medians (:func:`median_report`), a note for each sweep left out because one of its
    rates' all-reduce timings could not be fitted). Raises UnfittableRate when none could be."""
    reports: list[CliffReport] = []
    skipped: list[str] = []
    failure: UnfittableRate | None = None
    for n, sweep in enumerate(sweeps, 1):
        points: list[LinkPoint] = []
        try:
            for rate, sizes, vals in zip(sweep.rates, sweep.sizes, sweep.values):
                points.append(link_point(rate, vals, sizes, sweep.cap_mb))
        except ValueError as exc:
            failure = failure or UnfittableRate(rate, str(exc), points)
            skipped.append(f"sweep {n} of {len(sweeps)} not judged: the all-reduce timings at {rate_text(rate)} "
                           f"cannot be fitted ({exc})")
            continue
        reports.append(validate(points))
    if not reports:
        assert failure is not None
        raise failure
    return median_report(reports), skipped


def knees(points: Sequence[LinkPoint]) -> tuple[int | None, int | None]:
    """(measured, predicted) knee as indices into ``points`` ([unshaped, shaped rates
    descending]). Only a shaped rate can be the knee: the unshaped point is the baseline the
    step bends from. The floor is each rate's compute plus DDP's fixed cost plus the
    communication already exposed on the unshaped link (its last bucket's all-reduce and the
    buffers' broadcast at loopback speed): what the link's *shaping* exposes is what makes the
    knee. Measured (examples/train_gpt.py, 21 sweeps): 0.73 ms of its 4.9 ms unshaped step was
    exposed already, 18 % of the compute and fixed cost, so a 7 % wobble at the fastest shaped
    rate crossed the 25 % share and put the measured knee there, 3 points from the predicted."""
    base, shaped = points[0], points[1:]
    scale = [p.compute_s + p.overhead_s for p in shaped]

    def knee(step: Callable[[LinkPoint], float]) -> int | None:
        exposed = max(0.0, step(base) - base.compute_s - base.overhead_s)
        index = knee_index([step(p) - exposed for p in shaped], scale)
        return None if index is None else index + 1

    return knee(lambda p: p.measured_step_s), knee(lambda p: p.predicted_step_s)


def table(points: Sequence[LinkPoint]) -> list[dict[str, str]]:
    """The sweep as rows for the report's evidence."""
    rows = []
    for p in points:
        rate = "unshaped" if p.rate_bits_per_s is None else f"{p.rate_bits_per_s / 1e6:.4g} Mbit/s"
        rows.append({"link": rate, "measured step": f"{p.measured_step_s * 1e3:.2f} ms",
                     "predicted step": f"{p.predicted_step_s * 1e3:.2f} ms",
                     "error": "calibration" if p.rate_bits_per_s is None else f"{p.error:.0%}",
                     "compute": f"{p.compute_s * 1e3:.2f} ms",
                     "exposed comm (measured)": f"{p.measured_exposed_s * 1e3:.2f} ms",
                     "alpha": f"{p.alpha_s * 1e6:.0f} us", "beta": f"{p.beta_bytes_per_s / 1e6:.3g} MB/s"})
    return rows
