"""The report's charts, one function per data contract of the checks (docs/architecture.md, "Where a new piece goes").

Every chart reads optional metrics keys and returns inline SVG, or ``None`` when its data is
absent or malformed: a chart is decoration around a verdict, so bad data costs the chart,
never the report. :func:`charts_for` is the only entry point the HTML renderer uses.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ._format import number
from ._svg import MARGIN_B, MARGIN_T, PALETTE, Canvas, Scale, esc, fmt, r
from .keys import (
    BEST_BUCKET_CAP_MB,
    CLIFF_KNEE,
    CLIFF_MAX_ERROR,
    CLIFF_RATIO,
    CLIFF_SWEEP,
    CLIFF_VALIDATED,
    CLIFF_WORLD_SIZE,
    CONFIGURED_BUCKET_CAP_MB,
    CULPRIT_RANK,
    PROJECTION_RELIABLE,
    RESUME_TRAJECTORIES,
    SIMULATOR_ERROR,
)
from .units import fmt_bytes

log = logging.getLogger(__name__)
Chart = dict[str, Any]  # {"title": str, "svg": Markup, "caption": str}
UNRELIABLE_GREY = "#94a3b8"


def _points(rows: Any, *keys: str) -> list[dict[str, float]]:
    """The well-formed rows of a list of dicts: every key a finite number; others dropped."""
    if not isinstance(rows, Sequence) or isinstance(rows, (str, bytes)):
        return []
    out: list[dict[str, float]] = []
    for row in rows:
        if not isinstance(row, Mapping):
            continue
        values = {k: number(row.get(k)) for k in keys}
        finite = {k: v for k, v in values.items() if v is not None}
        if len(finite) == len(keys):
            out.append(finite)
    return out


def bucket_sweep(metrics: Mapping[str, Any]) -> Chart | None:
    """Step time vs bucket_cap_mb on a log x axis, configured and best values marked."""
    pts = sorted(_points(metrics.get("sweep"), "bucket_cap_mb", "step_time_s"), key=lambda p: p["bucket_cap_mb"])
    pts = [p for p in pts if p["bucket_cap_mb"] > 0]
    if len(pts) < 2:
        return None
    c = Canvas("Bucket-size sweep: step time vs bucket_cap_mb")
    xs, ys = [p["bucket_cap_mb"] for p in pts], [p["step_time_s"] * 1e3 for p in pts]
    x = Scale(min(xs), max(xs), c.left + 10, c.right - 10, log=True)
    y = Scale(0, max(ys) * 1.15, c.bottom, c.top)
    c.axes(x, y, x_label="bucket_cap_mb (MB, log scale)", y_label="step time (ms)")
    configured, best = number(metrics.get(CONFIGURED_BUCKET_CAP_MB)), number(metrics.get(BEST_BUCKET_CAP_MB))
    if configured is not None and configured > 0:
        c.vline(x(configured), label=f"configured {configured:g} MB", cls="mark")
    if best is not None and best > 0 and best != configured:
        c.vline(x(best), label=f"best {best:g} MB", cls="good", row=1)
    c.polyline([(x(a), y(b)) for a, b in zip(xs, ys)], color=PALETTE[0], label="step time")
    caption = f"{len(pts)} sizes measured" + (f"; best {best:g} MB" if best is not None else "")
    return {"title": "Bucket-size sweep", "svg": c.render(), "caption": caption}


def straggler(metrics: Mapping[str, Any]) -> Chart | None:
    """Per-rank compute (solid) and wait (light) as stacked bars; the culprit rank outlined."""
    pts = sorted(_points(metrics.get("per_rank"), "rank", "compute_s", "wait_s"), key=lambda p: p["rank"])
    if not pts or len(pts) > 512:
        return None
    culprit = metrics.get(CULPRIT_RANK)
    c = Canvas("Per-rank compute vs wait time")
    totals = [max(p["compute_s"], 0) + max(p["wait_s"], 0) for p in pts]
    y = Scale(0, max(max(totals), 1e-9) * 1.15, c.bottom, c.top)
    n = len(pts)
    slot = (c.right - c.left) / n
    ticks = [p["rank"] for p in pts] if n <= 32 else [pts[i]["rank"] for i in range(0, n, max(n // 16, 1))]
    x_pos = {p["rank"]: c.left + slot * (i + 0.5) for i, p in enumerate(pts)}
    c.axes(Scale(0, 1, c.left, c.right), y, x_label="rank", y_label="time per step (ms)",
           y_fmt=lambda v: fmt(v * 1e3), x_ticks=[])
    for t in ticks:
        c.add(f'<text class="tick" x="{r(x_pos[t])}" y="{r(c.bottom + 18)}" text-anchor="middle">{esc(int(t))}</text>')
    bw = max(slot * 0.6, 1.0)
    for p in pts:
        px = x_pos[p["rank"]] - bw / 2
        comp, wait = max(p["compute_s"], 0), max(p["wait_s"], 0)
        top_c = y(comp)
        top_w = y(comp + wait)
        is_culprit = isinstance(culprit, int) and not isinstance(culprit, bool) and int(p["rank"]) == culprit
        cls = "bar culprit" if is_culprit else "bar"
        tip = f"rank {int(p['rank'])}: compute {comp * 1e3:.1f} ms, wait {wait * 1e3:.1f} ms"
        c.add(f'<g class="{cls}"><title>{esc(tip)}</title>'
              f'<rect class="compute" x="{r(px)}" y="{r(top_c)}" width="{r(bw)}" height="{r(c.bottom - top_c)}"/>'
              f'<rect class="wait" x="{r(px)}" y="{r(top_w)}" width="{r(bw)}" height="{r(top_c - top_w)}"/></g>')
    c.legend([("#2563eb", "compute"), ("#93c5fd", "wait (blocked in all-reduce)")])
    caption = f"culprit: rank {culprit}" if isinstance(culprit, int) and not isinstance(culprit, bool) else "no culprit named"
    return {"title": "Straggler: per-rank compute vs wait", "svg": c.render(), "caption": caption}


def _pow2_ticks(lo: float, hi: float, most: int = 8) -> list[float]:
    first, last = math.ceil(math.log2(lo)), math.floor(math.log2(hi))
    step = max(1, math.ceil((last - first + 1) / most))
    return [2.0**k for k in range(first, last + 1) if k % step == 0]


def bandwidth(metrics: Mapping[str, Any]) -> Chart | None:
    """Bus and algorithm bandwidth vs message size (log x), as nccl-tests reports them."""
    pts = sorted(_points(metrics.get("sweep"), "bytes", "busbw_gbps"), key=lambda p: p["bytes"])
    pts = [p for p in pts if p["bytes"] > 0]
    if len(pts) < 2:
        return None
    alg = {p["bytes"]: p["algbw_gbps"] for p in _points(metrics.get("sweep"), "bytes", "algbw_gbps")}
    c = Canvas("All-reduce bandwidth vs message size")
    xs = [p["bytes"] for p in pts]
    top = max([p["busbw_gbps"] for p in pts] + list(alg.values()))
    x = Scale(min(xs), max(xs), c.left + 10, c.right - 10, log=True)
    y = Scale(0, max(top, 1e-9) * 1.15, c.bottom, c.top)
    c.axes(x, y, x_label="message size (log scale)", y_label="bandwidth (GB/s)", x_fmt=fmt_bytes,
           x_ticks=_pow2_ticks(min(xs), max(xs)))
    c.polyline([(x(p["bytes"]), y(p["busbw_gbps"])) for p in pts], color=PALETTE[0], label="busbw")
    algs = [(x(b), y(alg[b])) for b in xs if b in alg]
    if len(algs) >= 2:
        c.polyline(algs, color=PALETTE[1], label="algbw", dashed=True)
        c.legend([(PALETTE[0], "bus bandwidth"), (PALETTE[1], "algorithm bandwidth")])
    else:
        c.legend([(PALETTE[0], "bus bandwidth")])
    alpha, beta = number(metrics.get("alpha_s")), number(metrics.get("beta_bytes_per_s"))
    caption = f"peak busbw {max(p['busbw_gbps'] for p in pts):.1f} GB/s"
    if alpha is not None and beta is not None:
        caption += f"; fitted α = {alpha * 1e6:.1f} µs, β = {beta / 1e9:.1f} GB/s"
    return {"title": "All-reduce bandwidth", "svg": c.render(), "caption": caption}


def scaling(metrics: Mapping[str, Any]) -> Chart | None:
    """Projected scaling efficiency vs world size (log2 x), the cliff marked.

    A projection the check calls unreliable (:data:`PROJECTION_RELIABLE` false: its simulator
    missed the measured step) is drawn grey and dashed, with no cliff, under a title and a
    caption that say it is not a prediction: a solid curve would show a guess as a finding."""
    pts = sorted(_points(metrics.get("projection"), "world_size", "efficiency"), key=lambda p: p["world_size"])
    pts = [p for p in pts if p["world_size"] >= 1]
    if len(pts) < 2:
        return None
    unreliable = metrics.get(PROJECTION_RELIABLE) is False
    c = Canvas("Scaling projection: efficiency vs world size" + (" (unreliable, not a prediction)" if unreliable else ""))
    xs = [p["world_size"] for p in pts]
    eff = [p["efficiency"] * 100 if p["efficiency"] <= 1.5 else p["efficiency"] for p in pts]
    x = Scale(min(xs), max(xs), c.left + 10, c.right - 10, log=True)
    y = Scale(0, max(105.0, max(eff) * 1.05), c.bottom, c.top)
    pow2 = [2.0**k for k in range(20) if min(xs) <= 2.0**k <= max(xs)]
    c.axes(x, y, x_label="world size (ranks, log scale)", y_label="scaling efficiency (%)",
           x_fmt=lambda v: f"{v:g}", x_ticks=pow2 if len(pow2) >= 2 else None)
    c.add(f'<line class="mark" x1="{r(c.left)}" x2="{r(c.right)}" y1="{r(y(50))}" y2="{r(y(50))}"/>')
    if unreliable:
        c.polyline([(x(a), y(b)) for a, b in zip(xs, eff)], color=UNRELIABLE_GREY, label="unreliable projection",
                   dashed=True)
        c.add(f'<text class="bad-label" x="{r((c.left + c.right) / 2)}" y="{r(c.top + 28)}" text-anchor="middle">'
              f"UNRELIABLE: the simulator missed the measured step; not a prediction</text>")
        error = number(metrics.get(SIMULATOR_ERROR))
        why = (f"the simulator is off by {error:.0%} against the measured DDP step" if error is not None
               else "no DDP step was measured to check the simulator against")
        caption = f"not a prediction: {why}, so no scaling cliff is claimed (shape only)"
        return {"title": "Scaling projection (unreliable)", "svg": c.render(), "caption": caption}
    cliff = number(metrics.get(CLIFF_WORLD_SIZE))
    if cliff is not None and cliff > 0:
        c.vline(x(cliff), label=f"cliff at {cliff:g} ranks", cls="bad")
    c.polyline([(x(a), y(b)) for a, b in zip(xs, eff)], color=PALETTE[2], label="efficiency")
    caption = f"projected from the fitted α-β model; {eff[-1]:.0f}% at {xs[-1]:g} ranks"
    return {"title": "Scaling projection", "svg": c.render(), "caption": caption}


def link_cliff(metrics: Mapping[str, Any]) -> Chart | None:
    """Step time vs link rate (log x, slower to the right): measured compute, DDP's fixed cost
    and exposed communication stacked, the measured and predicted step as lines, both knees."""
    rows = metrics.get(CLIFF_SWEEP)
    pts = sorted((p for p in _points(rows, "rate_gbps", "measured_step_s", "predicted_step_s", "compute_s")
                  if p["rate_gbps"] > 0), key=lambda p: -p["rate_gbps"])
    if len(pts) < 2:
        return None
    cost = {p["rate_gbps"]: max(p["overhead_s"], 0) for p in _points(rows, "rate_gbps", "overhead_s")}
    c = Canvas("Scaling cliff: step time vs link rate")
    rates = [p["rate_gbps"] * 1e3 for p in pts]  # Mbit/s
    x = Scale(min(rates), max(rates), c.right - 24, c.left + 24, log=True)
    top = max(max(p["measured_step_s"], p["predicted_step_s"]) for p in pts)
    y = Scale(0, top * 1e3 * 1.2, c.bottom, c.top)
    c.axes(x, y, x_label="link rate (Mbit/s, log scale; slower to the right)", y_label="step time (ms)",
           x_fmt=lambda v: f"{v:.3g}")
    slot = (c.right - c.left) / (len(pts) + 1)
    for p, rate in zip(pts, rates):
        comp, fixed = max(p["compute_s"], 0) * 1e3, cost.get(p["rate_gbps"], 0.0) * 1e3
        exposed = max(p["measured_step_s"] * 1e3 - comp - fixed, 0)
        px, bw = x(rate) - slot * 0.3, slot * 0.6
        tip = (f"{rate:.4g} Mbit/s: compute {comp:.1f} ms, DDP fixed cost {fixed:.1f} ms, exposed comm "
               f"{exposed:.1f} ms; measured {p['measured_step_s'] * 1e3:.1f} ms, predicted "
               f"{p['predicted_step_s'] * 1e3:.1f} ms")
        parts, base = [], 0.0
        for height, fill in ((comp, "#2563eb"), (fixed, "#a5b4fc"), (exposed, "#fca5a5")):
            parts.append(f'<rect x="{r(px)}" y="{r(y(base + height))}" width="{r(bw)}" '
                         f'height="{r(y(base) - y(base + height))}" fill="{fill}"/>')
            base += height
        c.add(f'<g class="bar"><title>{esc(tip)}</title>{"".join(parts)}</g>')
    c.polyline([(x(a), y(p["measured_step_s"] * 1e3)) for a, p in zip(rates, pts)], color=PALETTE[0], label="measured")
    c.polyline([(x(a), y(p["predicted_step_s"] * 1e3)) for a, p in zip(rates, pts)], color=PALETTE[1],
               label="predicted", dashed=True)
    knee = metrics.get(CLIFF_KNEE)
    for row, (key, label, cls) in enumerate((("measured_gbps", "knee (measured)", "bad"),
                                             ("predicted_gbps", "knee (predicted)", "mark"))):
        at = number(knee.get(key)) if isinstance(knee, Mapping) else None
        if at is not None and at > 0:
            c.vline(x(at * 1e3), label=label, cls=cls, row=row)
    c.legend([(PALETTE[0], "measured"), (PALETTE[1], "predicted"), ("#2563eb", "compute"),
              ("#a5b4fc", "DDP fixed"), ("#fca5a5", "exposed comm")])
    error, ratio = number(metrics.get(CLIFF_MAX_ERROR)), number(metrics.get(CLIFF_RATIO))
    caption = f"{len(pts)} shaped rates"
    if ratio is not None:
        caption += f"; step x{ratio:.2f} at the lowest rate"
    if error is not None:
        verdict = "validated" if metrics.get(CLIFF_VALIDATED) is True else "unvalidated"
        caption += f"; simulator max error {error:.0%} ({verdict})"
    return {"title": "Scaling cliff", "svg": c.render(), "caption": caption}


def _event_window(e: Mapping[str, Any]) -> tuple[float, float] | None:
    start = number(e.get("t_start"))
    if start is None:
        return None
    end = number(e.get("t_end"))
    return start, end if end is not None and end >= start else start


def timeline(metrics: Mapping[str, Any], events: Sequence[Mapping[str, Any]]) -> Chart | None:
    """One lane per rank, one box per step; overlapping fault windows shaded (jepsen-style)."""
    steps = _points(metrics.get("timeline"), "rank", "step", "t_start", "t_end")
    steps = [s for s in steps if s["t_end"] >= s["t_start"]][:5000]
    if not steps:
        return None
    t0, t1 = min(s["t_start"] for s in steps), max(s["t_end"] for s in steps)
    windows = [(w, e) for e in events if isinstance(e, Mapping) and (w := _event_window(e)) and w[1] >= t0 and w[0] <= t1]
    ranks = sorted({int(s["rank"]) for s in steps})[:64]
    lane = 22
    c = Canvas("Step timeline per rank", height=MARGIN_T + MARGIN_B + 20 + lane * len(ranks))
    c.top += 20
    x = Scale(0, max(t1 - t0, 1e-9), c.left, c.right)
    c.axes(x, Scale(0, 1, c.bottom, c.top), x_label="time since first step (s)", y_label="", y_fmt=lambda v: "",
           x_fmt=lambda v: f"{v:.3g}")
    for i, rank in enumerate(ranks):
        ly = c.top + i * lane
        c.add(f'<text class="tick" x="{r(c.left - 6)}" y="{r(ly + lane / 2 + 4)}" text-anchor="end">rank {rank}</text>')
    for s in steps:
        if int(s["rank"]) not in ranks:
            continue
        ly = c.top + ranks.index(int(s["rank"])) * lane
        a, b = x(s["t_start"] - t0), x(s["t_end"] - t0)
        shade = PALETTE[0] if int(s["step"]) % 2 == 0 else "#60a5fa"
        tip = f"rank {int(s['rank'])} step {int(s['step'])}: {(s['t_end'] - s['t_start']) * 1e3:.1f} ms"
        c.add(f'<rect class="step" x="{r(a)}" y="{r(ly + 3)}" width="{r(max(b - a, 0.8))}" height="{r(lane - 6)}" fill="{shade}">'
              f"<title>{esc(tip)}</title></rect>")
    # Bands go on top of the steps (translucent), or the steps would hide the fault window.
    for w, e in windows:
        a, b = x(max(w[0], t0) - t0), x(min(w[1], t1) - t0)
        tip = f"{e.get('name')} (rank {e.get('rank')}, step {e.get('step')}, {e.get('phase') or 'phase ?'})"
        c.add(f'<rect class="fault" x="{r(a)}" y="{r(c.top)}" width="{r(max(b - a, 2))}" height="{r(c.bottom - c.top)}">'
              f"<title>{esc(tip)}</title></rect>")
    if windows:
        c.top -= 20  # the legend sits in the extra headroom above the lanes
        c.legend([("#ef4444", "fault window")])
    caption = f"{len(ranks)} rank(s), {len({int(s['step']) for s in steps})} step(s), {len(windows)} fault window(s)"
    return {"title": "Timeline", "svg": c.render(), "caption": caption}


def _norms(values: Any) -> list[float]:
    if not isinstance(values, Sequence) or isinstance(values, (str, bytes)):
        return []
    out = [number(v) for v in values]
    return [v for v in out if v is not None] if all(v is not None for v in out) else []


def resume_trajectories(metrics: Mapping[str, Any]) -> Chart | None:
    """Rank 0's parameter norm per step: the uninterrupted run, and per kill scenario the
    steps before the kill (dashed) and the restart's (solid, from its first resumed step)."""
    runs = metrics.get(RESUME_TRAJECTORIES)
    if not isinstance(runs, Mapping) or not runs:
        return None
    ref = _norms(next((t.get("uninterrupted") for t in runs.values() if isinstance(t, Mapping)), None))
    if len(ref) < 2:
        return None
    # (label, points, dashed, where the kill was and its words)
    series: list[tuple[str, list[tuple[float, float]], bool, tuple[float, str] | None]] = []
    for name, t in list(runs.items())[:4]:
        if not isinstance(t, Mapping):
            continue
        start, kill = number(t.get("resumed_from")), number(t.get("kill_after"))
        before, resumed = _norms(t.get("before_kill")), _norms(t.get("resumed"))
        during = " during the save" if t.get("kill") == "during-save" else ""
        mark = (kill, f"kill{during} after step {kill:g}") if kill is not None else None
        series.append((f"{name}: before the kill", [(i + 1.0, v) for i, v in enumerate(before)], True, mark))
        if start is not None:
            series.append((f"{name}: restarted", [(start + i, v) for i, v in enumerate(resumed)], False, None))
    values = ref + [v for _, pts, _, _ in series for _, v in pts]
    lo, hi = min(values), max(values)
    pad = (hi - lo) * 0.1 or abs(hi) * 0.01 or 1.0
    c = Canvas("Resume: parameter norm per optimizer step, uninterrupted vs restarted")
    last = max([float(len(ref))] + [px for _, pts, _, _ in series for px, _ in pts])
    x = Scale(1, max(last, 2), c.left + 10, c.right - 10)
    y = Scale(lo - pad, hi + pad, c.bottom, c.top)
    c.axes(x, y, x_label="optimizer step", y_label="parameter L2 norm (rank 0)", x_fmt=lambda v: f"{v:g}",
           x_ticks=[float(k) for k in range(1, int(last) + 1)] if last <= 24 else None, y_fmt=lambda v: f"{v:.4g}")
    c.polyline([(x(i + 1.0), y(v)) for i, v in enumerate(ref)], color=PALETTE[0], label="uninterrupted")
    legend = [(PALETTE[0], "uninterrupted")]
    for k, (label, pts, dashed, mark) in enumerate(series):
        color = PALETTE[1 + (k // 2) % (len(PALETTE) - 1)]
        if pts:
            c.polyline([(x(a), y(b)) for a, b in pts], color=color, label=label, dashed=dashed)
        if mark is not None:
            c.vline(x(mark[0]), label=mark[1], cls="bad", row=k // 2)
        if not dashed:
            legend.append((color, label.split(":")[0]))
    c.legend(legend)
    first = metrics.get("first_divergence")
    caption = (f"first divergence: {first.get('what')} at step {first.get('step')} on rank {first.get('rank')}"
               if isinstance(first, Mapping) else "no divergence: every resumed step equal")
    return {"title": "Resume trajectories", "svg": c.render(), "caption": caption}


BUILDERS: tuple[Callable[[Mapping[str, Any]], Chart | None], ...] = (bucket_sweep, straggler, bandwidth, scaling,
                                                                     link_cliff, resume_trajectories)


def charts_for(check: Mapping[str, Any], events: Sequence[Any] = ()) -> list[Chart]:
    """Every chart one check's metrics support; events with ``check == id`` shade its timeline."""
    metrics = check.get("metrics")
    if not isinstance(metrics, Mapping):
        return []
    own = [e for e in events if isinstance(e, Mapping) and e.get("check") == check.get("id")]
    out: list[Chart] = []
    for build in (*BUILDERS, lambda m: timeline(m, own)):
        try:
            chart = build(metrics)
        except Exception:
            log.debug("chart skipped for %r", check.get("id"), exc_info=True)
            chart = None
        if chart is not None:
            out.append(chart)
    return out

