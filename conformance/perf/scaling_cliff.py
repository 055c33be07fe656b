"""``scaling-cliff``: the target's own DDP step behind a shaped link, and the simulator held to it.

Contract (docs/ddp-background.md, "Scaling cliffs"): DDP hides a bucket's all-reduce behind the
rest of backward only while the link moves the bucket faster than backward produces the next
one; below that rate the exposed communication grows and the step time bends upward. On
loopback the "network" is a memory copy and the cliff can only be projected; here it is
reproduced: the world's ranks run in a private network namespace whose loopback is shaped with
``tc tbf`` (``conformance/harness/world/_netns.py``; the ``slow-link`` fault's effect).

Evidence, at each rate of a sweep from unshaped down to where the exposed communication is
several times the compute (rates chosen from the model's gradient bytes and compute): the
DDP step (the later rank's, lower quartile: ``cliff.model.measured_step``), the compute side
by side (a plain no-DDP pass before each step: the simulator's input), DDP's own
communication time, that rate's alpha-beta fit (an all-reduce sweep under the same shaping,
every result checked exact) and the simulator's predicted step from the backward profile,
DDP's bucket layout and that fit. The unshaped link is measured
first and after every rate: DDP's fixed per-step cost (what the unshaped step takes beyond the
simulated one) is calibrated on every unshaped measurement and its median added to each
prediction, and the unshaped fits' median latency is the software's part of every message's
latency (what a shaped rate's fit adds beyond it is bytes on the link, which the burst pays
for: ``ShapedLink.with_unshaped_latency``); every shaped point is a validation. The sweep
runs up to :data:`REPEATS` times in one world at the first one's rates and is judged by its
medians per rate (``cliff.model.median_report``): one sweep's fast rates are mostly a small
host's scheduling noise. The timed steps per rate and the number of sweeps are sized from the
step measured first (:func:`point_steps`, :data:`SWEEPS_BUDGET_S`): a large model's long step
needs fewer samples, and the check's cost stays a few minutes instead of growing with the model. The knee (``cliff.model.knees``), measured and predicted.

The bucket layout that moves the knee (``cliff.layout``): proposed by the simulator at the
measured knee, then re-run side by side at that rate against the configured one, and reported
as a remedy ("verified fix" / "did not fix" / "suggested, not verified") -- never claimed from
the model alone; the recommendation is made only when verified.

Verdict: failed if an all-reduce result was wrong; skipped without the privilege or ``tc``
(the reason named), on one rank, or under --attach; inconclusive when a rate's timings cannot
be fitted or the sweep reproduced no cliff (the lowest rate's step under
:data:`CLIFF_MIN_RATIO` x the unshaped one); passed otherwise. The simulator is "validated"
only when every shaped rate is within ``cliff.model.ERROR_BOUND`` and the predicted knee
within one sweep point of the measured one; otherwise the message says it is unvalidated and
by how much.

    ddp-conformance run --checks scaling-cliff                      # as root (CAP_NET_ADMIN)
    ddp-conformance run --target my_target.py --checks scaling-cliff
    ddp-conformance run --target my_target.py --checks scaling-cliff --link-gbps 100

With ``--link-gbps`` the message and the ``link_projection`` metric project the step onto that
per-rank link at 1..1024 ranks (the sweep's fitted latency, the user's bandwidth, DDP's fixed
cost), marked unvalidated when the sweep did not validate the simulator, and saying how far it
extrapolates past the rates and the world size that were measured.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ddp_conformance.reports.keys import (
    CLIFF_KNEE,
    CLIFF_MAX_ERROR,
    CLIFF_RATIO,
    CLIFF_SWEEP,
    CLIFF_VALIDATED,
    LINK_PROJECTION,
)
from ddp_conformance.reports.units import fmt_bytes

from ..harness.context import CheckContext
from ..harness.outcome import Outcome
from ..harness.remedies import REMEDIES, Remedy, to_json
from ..harness.world import ETHERNET_MTU, LinkShape, NetworkUnavailable, World, WorldLike, unavailable_reason
from .cliff import link_point, project_link, verify_layout
from .cliff import model as cm

#: Exposed communication the shaped rates aim at, as multiples of the compute measured
#: unshaped first: from well hidden (a tenth) to six times the compute, where the cliff is
#: unmistakable even when that first compute was inflated by a busy host.
EXPOSURES = (0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.4)
#: The lowest rate's step over the unshaped one below which no cliff was reproduced.
CLIFF_MIN_RATIO = 1.5
#: Timed DDP steps (each after a plain pass) and timed all-reduces per size, at each rate.
#: 24 steps: the step is read per step on the later rank (``cliff.model.measured_step``), so
#: these are its samples (12 gave a tiny model's lower quartile in a host's slow mode, 3-4 ms
#: on a 1 ms step, at one rate in three on a quiet host); a step costs 1-40 ms here.
STEPS, ITERS = 24, 6
#: Sweeps measured (in one world, at the first one's rates) and judged by their medians per
#: rate (``cliff.model.median_report``): on a 2-core host one sweep validated tied-lm's
#: simulator 7 times in 21, the medians of three 6 times in 7. At most: see SWEEPS_BUDGET_S.
REPEATS = 3
#: Why the check's cost grew with the model: its counts were fixed -- REPEATS sweeps of 15 link
#: points, each STEPS timed DDP steps after as many plain passes, the shaped ones at 1.1-7.4x
#: the compute -- about 3,300 steps' compute whatever a step costs: 61 s at 2 M parameters
#: (3,860 bare training steps), more than 18 minutes at 34 M. Those counts were set for the
#: built-ins' 1-40 ms steps, where a host's time slices are the step's size and only many
#: samples find its lower quartile; a step of a tenth of a second or more is long against
#: them. So the timed steps per rate are sized from the unshaped step measured first
#: (POINT_BUDGET_S of steps, between MIN_STEPS and STEPS), and a further sweep runs only while
#: the sweeps so far, one more included, fit in SWEEPS_BUDGET_S (the first always runs).
POINT_BUDGET_S = 0.5
#: The fewest timed steps per rate: a comm hook's steady state (MIN_STEADY, 4) twice over.
MIN_STEPS = 8
SWEEPS_BUDGET_S = 120.0
#: The target of the default run (no --target): the built-in with the most gradient bytes
#: (29 KiB, a GRU and a tied embedding), whose cliff is reached at tens of Mbit/s.
VEHICLE = "tied-lm"


@dataclass(frozen=True, slots=True)
class SweepData:
    """What the sweep measured: every rank's ``link_point`` value per rate, in sweep order
    (None: unshaped; the unshaped rate is measured first and again after every shaped rate)."""

    world_size: int
    cap_mb: float | None
    rates: tuple[float | None, ...]
    sizes: tuple[tuple[int, ...], ...]
    values: tuple[tuple[dict[str, Any], ...], ...]


def run(ctx: CheckContext) -> Outcome:
    if ctx.world_size < 2:
        return Outcome.skipped(f"world_size={ctx.world_size}: one rank has no link to shape; "
                               f"run with --world-size 2 or more")
    if ctx.new_world is None:
        return Outcome.skipped("under --attach the ranks' network is the launcher's: a shaped "
                               "private network needs ranks the suite starts itself")
    reason = unavailable_reason()
    if reason:
        return Outcome.skipped(f"no shaped link here: {reason}")
    spec, cap_mb = ctx.target.spec, ctx.target.ddp_kwargs.get("bucket_cap_mb")
    if ctx.injected:
        spec, cap_mb = VEHICLE, None
    try:
        with ctx.fresh_world(private_network=True) as world:
            sweeps: list[SweepData] = []
            started = _now()
            while len(sweeps) < REPEATS and (not sweeps or (_now() - started) * (len(sweeps) + 1) / len(sweeps)
                                             <= SWEEPS_BUDGET_S):
                rates = [r for r in sweeps[0].rates if r is not None] if sweeps else None
                # A repeat's first unshaped point too is sized from the first sweep's step.
                steps = point_steps(cm.measured_step(sweeps[0].values[0]), STEPS) if sweeps else STEPS
                sweeps.append(measure(world, spec, cap_mb=cap_mb, exposures=EXPOSURES, steps=steps, iters=ITERS,
                                      rates=rates, on_shape=lambda rate: _record(ctx, rate)))
            # The layout that moves the knee, proposed by the simulator and re-run side by side
            # in the same world: nothing is claimed from the model alone.
            layout = verify_layout(world, spec, sweeps, cap_mb) if isinstance(world, World) else None
    except NetworkUnavailable as exc:
        return Outcome.skipped(f"no shaped link here: {exc}")
    return judge(sweeps, link_gbps=ctx.link_gbps, layout=layout)


def point_steps(step_s: float, most: int = STEPS) -> int:
    """Timed DDP steps per link rate for an unshaped step of ``step_s``: POINT_BUDGET_S of them,
    at least MIN_STEPS, at most ``most`` (a ceiling below MIN_STEPS wins: a test's short sweep)."""
    return min(most, max(MIN_STEPS, math.ceil(POINT_BUDGET_S / max(step_s, 1e-6))))


def _now() -> float:
    return time.monotonic()


def _record(ctx: CheckContext, rate: float | None) -> None:
    ctx.record_event("slow-link", rate_gbps=None if rate is None else rate / 1e9)


def measure(world: WorldLike, target_spec: str, *, cap_mb: float | None, exposures: Sequence[float] = EXPOSURES,
            steps: int = STEPS, iters: int = ITERS, on_shape: Any = None,
            rates: Sequence[float] | None = None) -> SweepData:
    """The sweep on ``world`` (a World started with ``private_network=True``): at ``rates``
    (bits/s, descending), else at the rates where all-reducing the model's gradients would
    take each of ``exposures`` times its compute measured unshaped first."""
    world.start()
    link = world.link if isinstance(world, World) else None
    if link is None:
        raise NetworkUnavailable("the world was not started with a private network")
    measured: list[float | None] = []
    sizes: list[tuple[int, ...]] = []
    values: list[tuple[dict[str, Any], ...]] = []

    def at(rate: float | None, total_bytes: int, steps: int) -> dict[str, Any]:
        # Unshaped is the same link without its rate limit: the shaped rates' MTU, not
        # loopback's 64 KiB. Measured (examples/train_compiled.py, a 2.2 MB all-reduce): at
        # 1500 bytes the loopback carried 750-830 MB/s however fast the rate, against 1.5 GB/s
        # at 64 KiB, and the CPU the extra packets took from backward put the measured knee at
        # the fastest rate, 4 points from the predicted one.
        link.shape(LinkShape(rate) if rate is not None else None, unshaped_mtu=ETHERNET_MTU)
        if on_shape is not None:
            on_shape(rate)
        point_sizes = tuple(cm.fit_sizes(total_bytes, rate))
        result = world.run(link_point, target_spec, point_sizes, steps=steps, iters=iters)
        measured.append(rate)
        sizes.append(point_sizes)
        values.append(tuple(r.value for r in result))
        return result[0].value

    first = at(None, 0, steps)
    total = sum(first["profile"]["nbytes"])
    compute = first["profile"]["forward_s"] + first["profile"]["backward_end_s"]
    if rates is None:
        rates = cm.sweep_rates(total, compute, world.world_size, exposures=exposures)
    # The rest of the sweep takes as many timed steps as the unshaped step measured first calls
    # for (``steps`` at most): a long step is long against the host's time slices.
    steps = point_steps(cm.measured_step(values[0]), steps)
    for rate in rates:
        at(rate, total, steps)
        # The unshaped link again after every rate: DDP's fixed cost is calibrated on readings
        # spread through the sweep (their median), and a load change shows as their drift.
        at(None, total, steps)
    link.shape(None)
    return SweepData(world_size=world.world_size, cap_mb=cap_mb, rates=tuple(measured), sizes=tuple(sizes),
                     values=tuple(values))


def judge(data: SweepData | Sequence[SweepData], *, link_gbps: float | None = None,
          layout: Remedy | str | None = None) -> Outcome:
    """The verdict on one sweep, or on several at the same rates (judged by their medians)."""
    sweeps = (data,) if isinstance(data, SweepData) else tuple(data)
    wrong = [(rate, v["sweep"]["wrong"]) for sweep in sweeps for rate, vals in zip(sweep.rates, sweep.values)
             for v in vals if any(v["sweep"]["wrong"])]
    if wrong:
        where = ", ".join(f"{cm.rate_text(rate)}: {sum(w)}" for rate, w in wrong[:4])
        return Outcome.failed(f"all-reduce results differ from the exact sum behind the shaped link ({where})",
                              evidence={"wrong_results": [{"rate": r, "wrong": w} for r, w in wrong]},
                              recommendation="A collective returned a wrong sum: suspect the transport "
                                             "(gloo version, the host's network stack), not the model.")
    try:
        report, skipped = cm.sweep_report(sweeps)
    except cm.UnfittableRate as exc:
        return Outcome.inconclusive(f"the all-reduce timings at {cm.rate_text(exc.rate)} cannot be fitted "
                                    f"({exc.reason}); the host is too noisy to measure the cliff",
                                    metrics={CLIFF_SWEEP: [p.to_metric() for p in exc.points]})
    data = sweeps[0]
    metrics: dict[str, Any] = {
        CLIFF_SWEEP: [p.to_metric() for p in report.points], CLIFF_RATIO: round(report.cliff_ratio, 3),
        CLIFF_MAX_ERROR: round(report.max_error, 4), CLIFF_VALIDATED: report.validated,
        CLIFF_KNEE: {"measured_gbps": _gbps(report.measured_knee), "predicted_gbps": _gbps(report.predicted_knee),
                     "measured_index": report.measured_index, "predicted_index": report.predicted_index},
        "ddp_overhead_s": report.overhead_s, "unshaped_drift": round(report.unshaped_drift, 4),
        "gradient_bytes": sum(data.values[0][0]["profile"]["nbytes"]), "world_size": data.world_size,
        "buffer_bytes": int(data.values[0][0].get("buffer_bytes", 0)),
        "shaped_rates": len(report.points) - 1, "sweeps": len(sweeps) - len(skipped),
    }
    evidence: dict[str, Any] = {"table": cm.table(report.points), "notes": report.notes() + skipped}
    grads = fmt_bytes(metrics["gradient_bytes"])
    if metrics["buffer_bytes"]:
        # DDP broadcasts them from rank 0 before every forward (broadcast_buffers): on the link
        # and not overlapped with anything, so they are part of the cliff (ShapedLink).
        grads += f" of gradients and {fmt_bytes(metrics['buffer_bytes'])} of buffers broadcast before every forward"
    else:
        grads += " of gradients"
    lowest = cm.rate_text(report.points[-1].rate_bits_per_s)
    # The report's table shows one figure per check: the cliff, and whether the model held to it.
    metrics["key_figure"] = (f"step x{report.cliff_ratio:.1f} at {lowest}; simulator "
                             + (f"within {report.max_error:.0%}" if report.validated
                                else f"unvalidated ({report.max_error:.0%} off)"))
    if report.cliff_ratio < CLIFF_MIN_RATIO:
        metrics["key_figure"] = f"no cliff: x{report.cliff_ratio:.2f} at {lowest}"
        return Outcome.inconclusive(
            f"no cliff reproduced: at {lowest} the step is only "
            f"x{report.cliff_ratio:.2f} the unshaped one ({grads})", metrics=metrics,
            evidence=evidence)
    knee = (f"knee at {cm.rate_text(report.measured_knee)} measured, {cm.rate_text(report.predicted_knee)} predicted"
            if report.measured_index is not None else "no knee in the sweep")
    over = f" (medians of {metrics['sweeps']} sweeps)" if metrics["sweeps"] > 1 else ""
    model = (f"simulator validated: within {report.max_error:.0%} at all {len(report.points) - 1} shaped rates{over}"
             if report.validated else
             f"simulator unvalidated: off by up to {report.max_error:.0%}{over} (bound {cm.ERROR_BOUND:.0%})"
             + ("" if report.knee_agrees else ", its knee more than one sweep point from the measured one"))
    suffix, recommendation = "", None
    if isinstance(layout, Remedy):
        evidence[REMEDIES] = to_json([layout])
        suffix += f"; {layout.change} re-run at the knee: {layout.status}"
        if layout.verified:
            recommendation = (f"Set {layout.change}: at the knee's link rate it measured "
                              f"{layout.evidence['proposed_step_s'] * 1e3:.1f} ms per step against "
                              f"{layout.evidence['configured_step_s'] * 1e3:.1f} ms configured (re-run side by side)")
    elif layout:
        evidence["notes"].append(f"bucket layout: {layout}")
    if link_gbps is not None:
        profile, _ = cm.combined_profile([v["profile"] for v in data.values[0]])
        projection = project_link(report, profile, link_gbps=link_gbps, world_size=data.world_size,
                                  cap_mb=data.cap_mb)
        metrics[LINK_PROJECTION] = projection.to_metric()
        suffix = f"; {projection.describe(data.world_size)}"
    return Outcome.passed(f"{knee}; step x{report.cliff_ratio:.1f} at {lowest} "
                          f"({grads}); {model}{suffix}", metrics=metrics, evidence=evidence,
                          recommendation=recommendation or _buffers_advice(metrics))


#: Buffers broadcast every step worth a recommendation, as a share of the gradients' bytes. Half:
#: the broadcast crosses the link before the forward, overlapped with nothing, while the
#: gradients' all-reduce hides behind backward until the knee. karpathy/pytorch-made's MADE
#: broadcasts its constant masks, 2.99 MiB beside 3 MiB of gradients, every step.
BUFFER_ADVICE_SHARE = 0.5


def _buffers_advice(metrics: dict[str, Any]) -> str | None:
    """Where the buffers DDP broadcasts every step weigh as much as half the gradients or more,
    what to do (only said when measured: the bytes are in the record)."""
    buffers, grads = metrics["buffer_bytes"], metrics["gradient_bytes"]
    if not buffers or buffers < BUFFER_ADVICE_SHARE * grads:
        return None
    return (f"DDP broadcasts {fmt_bytes(buffers)} of buffers from rank 0 before every forward, "
            f"{buffers / max(grads, 1):.1f}x the gradients it all-reduces, and nothing overlaps that broadcast: "
            f"if they are constant (a positional table, a mask) or every rank updates them alike, pass "
            f"broadcast_buffers=False to DDP (or keep a constant table as a plain tensor attribute instead of a "
            f"buffer)")


def _gbps(rate: float | None) -> float | None:
    return None if rate is None else rate / 1e9
