"""A very small SVG plotting kit: scales, ticks, axes, lines, bars, bands.

Why not matplotlib: the report is one self-contained HTML file that must open offline and
render identically in any browser; hand-written inline SVG is a few KB, needs no dependency,
and every string that enters it goes through :func:`esc`. All geometry is plain floats,
rounded to 0.1 px so the output stays small and diffable.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

from markupsafe import Markup, escape

WIDTH, HEIGHT = 640, 300
MARGIN_L, MARGIN_R, MARGIN_T, MARGIN_B = 64, 20, 16, 48
PALETTE = ("#2563eb", "#db2777", "#059669", "#d97706", "#7c3aed", "#0891b2")


def esc(value: object) -> str:
    return str(escape(str(value)))


def r(v: float) -> str:
    return f"{v:.1f}".rstrip("0").rstrip(".") if math.isfinite(v) else "0"


class Scale:
    """Maps a data domain to pixels, linearly or on a log10 axis."""

    def __init__(self, lo: float, hi: float, a: float, b: float, *, log: bool = False) -> None:
        if log:
            lo, hi = max(lo, 1e-300), max(hi, 1e-300)
        if hi <= lo:  # one point, or a flat series: open a window around it
            pad = abs(lo) * 0.1 if lo else 1.0
            lo, hi = (lo / 2, lo * 2) if log else (lo - pad, hi + pad)
        self.lo, self.hi, self.a, self.b, self.log = lo, hi, a, b, log

    def _t(self, v: float) -> float:
        return math.log10(max(v, 1e-300)) if self.log else v

    def __call__(self, v: float) -> float:
        lo, hi = self._t(self.lo), self._t(self.hi)
        return self.a + (self._t(v) - lo) / (hi - lo) * (self.b - self.a)

    def ticks(self, count: int = 5) -> list[float]:
        if self.log:
            return log_ticks(self.lo, self.hi)
        return linear_ticks(self.lo, self.hi, count)


def linear_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    span = hi - lo
    raw = span / max(count, 1)
    mag = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1.0
    nice = [m * mag for m in (0.5, 1, 2, 2.5, 5, 10)]
    at = next(i for i, step in enumerate(nice) if step >= raw)
    out = _ticks_every(lo, hi, nice[at])
    # A span that just misses a nice step leaves two ticks on the axis: halve it, or the
    # reader cannot tell the scale from two numbers.
    return out if len(out) >= 3 or at == 0 else _ticks_every(lo, hi, nice[at - 1])


def _ticks_every(lo: float, hi: float, step: float) -> list[float]:
    out: list[float] = []
    v = math.ceil(lo / step) * step
    while v <= hi + step * 1e-9 and len(out) < 50:
        out.append(round(v, 12))
        v += step
    return out


def log_ticks(lo: float, hi: float) -> list[float]:
    decades = range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
    mults = (1, 2, 5) if math.log10(hi / lo) <= 3 else (1,)
    out = [m * 10.0**d for d in decades for m in mults if lo * (1 - 1e-9) <= m * 10.0**d <= hi * (1 + 1e-9)]
    return out or [lo, hi]


def distinct(ticks: Sequence[float], labels: list[str]) -> list[str]:
    """``labels`` when no two ticks share one; else the ticks written with the fewest decimals
    that tell them apart. A narrow axis far from zero (a parameter norm between 10.4301 and
    10.4312) otherwise reads as five identical "10.43" ticks."""
    if len(set(labels)) == len(labels) or not any(labels):  # all blank: an axis drawn without words
        return labels
    for decimals in range(1, 13):
        precise = [f"{t:.{decimals}f}" for t in ticks]
        if len(set(precise)) == len(precise):
            return precise
    return [repr(t) for t in ticks]


def fmt(v: float) -> str:
    """Compact tick label: 1k, 2.5M, 0.01, 64."""
    a = abs(v)
    for div, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if a >= div:
            return f"{v / div:g}{suffix}"
    return f"{v:.3g}"


class Canvas:
    """An SVG document being assembled: a plot area with x/y scales and axis labels."""

    def __init__(self, title: str, *, width: int = WIDTH, height: int = HEIGHT) -> None:
        self.title, self.width, self.height = title, width, height
        self.left, self.right = MARGIN_L, width - MARGIN_R
        self.top, self.bottom = MARGIN_T, height - MARGIN_B
        self.parts: list[str] = []

    def add(self, markup: str) -> None:
        self.parts.append(markup)

    def axes(self, x: Scale, y: Scale, *, x_label: str, y_label: str, x_fmt: Callable[[float], str] = fmt,
             y_fmt: Callable[[float], str] = fmt, x_ticks: Iterable[float] | None = None) -> None:
        ys = y.ticks()
        for t, label in zip(ys, distinct(ys, [y_fmt(t) for t in ys])):
            py = y(t)
            self.add(f'<line class="grid" x1="{r(self.left)}" x2="{r(self.right)}" y1="{r(py)}" y2="{r(py)}"/>')
            self.add(f'<text class="tick" x="{r(self.left - 6)}" y="{r(py + 4)}" text-anchor="end">{esc(label)}</text>')
        xs = list(x_ticks if x_ticks is not None else x.ticks())
        for t, label in zip(xs, distinct(xs, [x_fmt(t) for t in xs])):
            px = x(t)
            self.add(f'<line class="tickmark" x1="{r(px)}" x2="{r(px)}" y1="{r(self.bottom)}" y2="{r(self.bottom + 5)}"/>')
            self.add(f'<text class="tick" x="{r(px)}" y="{r(self.bottom + 18)}" text-anchor="middle">{esc(label)}</text>')
        self.add(f'<line class="axis" x1="{r(self.left)}" x2="{r(self.right)}" y1="{r(self.bottom)}" y2="{r(self.bottom)}"/>')
        self.add(f'<line class="axis" x1="{r(self.left)}" x2="{r(self.left)}" y1="{r(self.top)}" y2="{r(self.bottom)}"/>')
        cx = (self.left + self.right) / 2
        self.add(f'<text class="label" x="{r(cx)}" y="{r(self.height - 8)}" text-anchor="middle">{esc(x_label)}</text>')
        cy = (self.top + self.bottom) / 2
        self.add(f'<text class="label" transform="translate(14 {r(cy)}) rotate(-90)" text-anchor="middle">{esc(y_label)}</text>')

    def polyline(self, points: Sequence[tuple[float, float]], *, color: str, label: str | None = None, dashed: bool = False) -> None:
        path = " ".join(f"{r(px)},{r(py)}" for px, py in points)
        dash = ' stroke-dasharray="5 4"' if dashed else ""
        self.add(f'<polyline class="series" points="{path}" stroke="{color}"{dash}/>')
        for px, py in points:
            self.add(f'<circle cx="{r(px)}" cy="{r(py)}" r="3.2" fill="{color}"><title>{esc(label or "")}</title></circle>')

    def vline(self, px: float, *, label: str, cls: str = "mark", row: int = 0) -> None:
        self.add(f'<line class="{cls}" x1="{r(px)}" x2="{r(px)}" y1="{r(self.top)}" y2="{r(self.bottom)}"/>')
        anchor = "end" if px > (self.left + self.right) / 2 else "start"
        dx = -4 if anchor == "end" else 4
        # Below the legend's row (``legend`` draws at the top edge), one row of text per ``row``.
        self.add(f'<text class="{cls}-label" x="{r(px + dx)}" y="{r(self.top + 28 + 14 * row)}" text-anchor="{anchor}">{esc(label)}</text>')

    def legend(self, items: Sequence[tuple[str, str]]) -> None:
        x = self.left + 8
        for color, label in items:
            self.add(f'<rect x="{r(x)}" y="{r(self.top + 4)}" width="10" height="10" rx="2" fill="{color}"/>')
            self.add(f'<text class="legend" x="{r(x + 14)}" y="{r(self.top + 13)}">{esc(label)}</text>')
            x += 22 + 7 * len(label)

    def render(self) -> Markup:
        body = "".join(self.parts)
        return Markup(
            f'<svg class="chart" viewBox="0 0 {self.width} {self.height}" '
            f'role="img" aria-label="{esc(self.title)}"><title>{esc(self.title)}</title>{body}</svg>'
        )
