"""Judging "equal within a dtype tolerance": per-tensor differences and the worst offender.

Never bitwise: DDP sums gradients in bucket order and ``bucket_cap_mb`` changes that order,
so a correct run differs from the reference in the last bits. A difference passes when
``|got - ref| <= atol + rtol * |ref|`` element-wise (numpy.allclose's rule); for gradients
the atol is capped at ``rtol x`` the gradients' scale (``scaled``: the absolute part protects
values near zero relative to the gradients, never gradients that are all tiny).

Tolerances, measured (CPU, fp32, gloo, 2 ranks, torch 2.13; built-in targets and the correct
targets of tests/targets, SGD and Adam, 3 steps; K=1 and K=4): correct runs differ from the
1-rank reference by at most 1.4e-6 absolute / 6.3e-7 relative in first-step gradients (the
tied LM, whose gradients reach ~2; the MLPs: 1.5e-8 / 2.1e-7) and by at most 1.3e-7 absolute /
1.0e-6 relative in parameters. A loss scaled by the world size gives a relative gradient error
of 1.0 (2 ranks), SGD parameter errors ~6e-2, Adam parameter errors only ~1e-7..1e-4 (Adam
normalises the update: the gradient shows the bug, the parameters barely do). Hence fp32
gradients atol 1e-6 + rtol 1e-5 (the worst correct run uses 0.09 of it; the smallest real error
is ~1e4 times over it) and fp32 parameters atol 1e-5 + rtol 1e-4.

These fixed tolerances are the *lower bound*. A noisier configuration (bf16 autocast, gradient
compression, a compiled graph) is judged against its own measured noise floor on top
(``floor``; ``TensorDiff.allowed_rel``): bf16 autocast + AdamW measures 3.7e-3 of a gradient's
scale, an fp16 compression hook 5.3e-4 against the uncompressed run — far over the fp32 rtol,
far under the smallest scaling bug (0.5). docs/numerics.md, "Measured", has the numbers. The
entries for tensors whose own dtype is not float32 (a model cast with ``.to(dtype)``) were set
from machine epsilon and then measured (the built-in MLP cast to the dtype, SGD, 2 gloo ranks,
K = 1 and 4): correct bf16 gradients differ by ≤ 6.8e-3 relative (0.07 of the bf16 tolerance),
fp16 by ≤ 8.5e-4 (0.05 of it), fp64 by ≤ 3.9e-16; a loss times N is off by 1.0 and fails in
each. The floor widens them where a run is noisier still.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any


@dataclass(frozen=True, slots=True)
class Tolerance:
    atol: float
    rtol: float

    def describe(self) -> str:
        return f"atol {self.atol:.0e} + rtol {self.rtol:.0e}·|ref|"


# (parameters, gradients) per dtype name.
TOLERANCES: dict[str, tuple[Tolerance, Tolerance]] = {
    "float32": (Tolerance(1e-5, 1e-4), Tolerance(1e-6, 1e-5)),
    "float64": (Tolerance(1e-12, 1e-10), Tolerance(1e-13, 1e-11)),
    "float16": (Tolerance(1e-2, 1e-2), Tolerance(1e-3, 1e-2)),
    "bfloat16": (Tolerance(5e-2, 5e-2), Tolerance(1e-2, 5e-2)),
}


def scaled(tol: Tolerance, scale: float) -> Tolerance:
    """``tol`` with its absolute part capped at ``rtol x scale``, the gradients' scale (the
    largest ``max|ref|`` of the tensors compared at one point; ``at_gradient_scale``).

    The absolute tolerance is there for values near zero *relative to the gradients*, whose
    relative error means nothing. Gradients that are all tiny are not "near zero": a loss
    scaled by 1e-6 (a token-sum loss over a run's tokens) gives gradients of ~1e-7, and a fixed
    atol of 1e-6 passed them doubled ("the absolute tolerance decided alone"). Capped, a model
    whose gradients have scale S allows ``rtol x S`` absolute near zero — for fp32 1e-5 of the
    scale, 14x the worst correct run's max|Δ|/max|ref| (7e-7, docs/numerics.md) — and models of
    scale >= atol / rtol (0.1 in fp32) keep the fixed rule. Relative to the model, not to each
    tensor: a conv bias right before BatchNorm has a gradient of rounding noise only (exactly 0
    in theory) and keeps the full atol next to gradients of scale 1. No scale (all zeros, or
    not finite): the fixed atol decides.
    """
    if not scale > 0 or not math.isfinite(scale) or tol.atol <= tol.rtol * scale:
        return tol
    return Tolerance(tol.rtol * scale, tol.rtol)


def at_gradient_scale(compared: list[Compared], scale: float) -> list[Compared]:
    """Gradient comparisons judged with their atol capped at ``rtol x scale`` (``scaled``).

    From the per-tensor summaries the ranks returned: a tensor fails past
    ``max|Δ| > atol' + rtol·max|ref|`` as well as past its element-wise ratio. (Element-wise
    that bound is at least as wide as ``atol' + rtol·|ref|`` at the worst element, so nothing
    the exact rule would pass fails here.) Unchanged where the cap changes nothing.
    """
    out = []
    for c in compared:
        tol = scaled(c.diff.tolerance, scale)
        if tol == c.diff.tolerance or not (c.got_present and c.ref_present) or math.isnan(c.diff.ratio):
            out.append(c)
            continue
        ratio = max(c.diff.ratio, c.diff.max_abs / (tol.atol + tol.rtol * c.diff.ref_max))
        out.append(replace(c, diff=replace(c.diff, ratio=ratio, tolerance=tol)))
    return out


def tolerance_for(dtype: Any, *, grad: bool) -> Tolerance:
    name = str(dtype).replace("torch.", "")
    params, grads = TOLERANCES.get(name, TOLERANCES["float32"])
    return grads if grad else params


@dataclass(frozen=True, slots=True)
class TensorDiff:
    name: str
    max_abs: float
    max_rel: float  # max |got - ref| / max |ref|: scale-free, robust to zeros in ref
    ratio: float  # worst |got - ref| / (atol + rtol |ref|): > 1 means outside the fixed tolerance
    tolerance: Tolerance
    note: str = ""
    worst_element: tuple[int, float, float] | None = None  # (flat index, got, ref): evidence
    ref_max: float = 0.0  # max |ref|: the tensor's scale (what max_rel is relative to)
    # The measured allowance (``floor``: margin x noise floor), relative to ``ref_max``; 0:
    # the fixed tolerance alone. A difference passes within either: the fixed tolerance is the
    # lower bound, the floor widens it for a configuration that is noisier (autocast, compression).
    allowed_rel: float = 0.0

    @property
    def judged_ratio(self) -> float:
        """The difference over what is allowed: > 1 fails. The smaller of the fixed-tolerance
        ratio and max_rel / allowed_rel (NaN stays NaN: never within anything)."""
        if self.allowed_rel > 0 and not math.isnan(self.ratio):
            return min(self.ratio, self.max_rel / self.allowed_rel)
        return self.ratio

    @property
    def ok(self) -> bool:
        return self.judged_ratio <= 1.0

    def describe_bound(self) -> str:
        fixed = self.tolerance.describe()
        if self.allowed_rel <= 0:
            return fixed
        return f"{fixed}, or {fmt(self.allowed_rel)}·max|ref| (the measured noise floor x margin)"

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "max_abs": self.max_abs, "max_rel": self.max_rel,
                "ratio": round(self.ratio, 4), "atol": self.tolerance.atol,
                "rtol": self.tolerance.rtol, "ref_max": self.ref_max,
                **({"allowed_rel": self.allowed_rel,
                    "judged_ratio": round(self.judged_ratio, 4)} if self.allowed_rel else {}),
                **({"note": self.note} if self.note else {}),
                **({"worst_element": {"flat_index": self.worst_element[0], "got": self.worst_element[1],
                                      "ref": self.worst_element[2]}} if self.worst_element else {})}


#: Elements per chunk of an on-device comparison: the temporaries of one chunk (~4 of them)
#: are all a comparison adds to the device's memory, whatever the size of the tensor compared.
#: On a CPU a chunk's passes must stay in the core's cache: 1 MiB (fp32) chunks compared a
#: 100 M-element gradient 2.8x faster than 4 MiB ones on one thread (0.19 s vs 0.52 s, and
#: parameters 1.4x). On a GPU, 4 Mi elements: each chunk is ~15 kernel launches and a host sync.
CHUNK = 1 << 18
DEVICE_CHUNK = 1 << 22


def chunk_for(device: Any) -> int:
    return CHUNK if getattr(device, "type", "cpu") == "cpu" else DEVICE_CHUNK


@dataclass(frozen=True, slots=True)
class Compared:
    """One tensor against its reference, reduced on the device to what the judges read.

    ``diff`` is the tolerance judgement, with its worst element as evidence; ``ref_sq``, ``dot``, ``got_sq`` and ``residual`` (``|got - f·ref|`` with
    ``f = dot / ref_sq``) are the projection the gradient-factor hypotheses need
    (``hypotheses.scale_from``). No tensor travels: a summary is a few floats per tensor.
    """

    diff: TensorDiff
    got_present: bool
    ref_present: bool
    ref_sq: float = 0.0
    dot: float = 0.0
    got_sq: float = 0.0
    residual: float = 0.0
    got_finite: bool = True
    ref_finite: bool = True

    @property
    def name(self) -> str:
        return self.diff.name


def compare_tensor(name: str, got: Any, ref: Any, *, grad: bool, project: bool | None = None,
                   release: Callable[[int, int], None] | None = None) -> Compared:
    """``got`` against ``ref`` where ``got`` lives (``ref`` is moved there), chunk by chunk.

    A missing tensor on one side is infinitely wrong; both missing is "no gradient on either
    side" (ratio 0). Element-wise rule as ``numpy.allclose``: ``|got - ref| <= atol + rtol·|ref|``.
    NaN propagates into the maxima (a NaN difference is never within tolerance). ``project``
    (default: ``grad``): measure the projection the gradient factor needs (three dot products
    and a second pass); parameters are judged by the tolerance alone. ``release(start, stop)``:
    called once elements [start, stop) of ``ref`` are compared in a pass (a memory-mapped
    snapshot drops their pages, ``snapshots``).
    """
    import torch

    tol = tolerance_for(getattr(ref if ref is not None else got, "dtype", "float32"), grad=grad)
    project = grad if project is None else project
    if got is None and ref is None:
        return Compared(TensorDiff(name, 0.0, 0.0, 0.0, tol, "no gradient on either side"), False, False)
    if got is None or ref is None:
        side = "DDP run" if got is None else "reference"
        present = ref if got is None else got
        sq, finite = _norm_sq(present)
        return Compared(TensorDiff(name, float("inf"), float("inf"), float("inf"), tol,
                                   f"gradient missing in the {side}"), got is not None, ref is not None,
                        ref_sq=sq if ref is not None else 0.0, got_sq=sq if got is not None else 0.0,
                        got_finite=finite if got is not None else True,
                        ref_finite=finite if ref is not None else True)
    if tuple(got.shape) != tuple(ref.shape):
        return Compared(TensorDiff(name, float("inf"), float("inf"), float("inf"), tol,
                                   f"shape {tuple(got.shape)} != reference {tuple(ref.shape)}"),
                        True, True, ref_sq=_norm_sq(ref)[0], got_sq=_norm_sq(got)[0])
    rows = None
    if got.layout != torch.strided or ref.layout != torch.strided:
        got, ref, rows = _densified(got, ref.to(got.device))
    g_flat = got.detach().reshape(-1)
    r_flat = ref.detach().to(got.device).reshape(-1)
    step = chunk_for(g_flat.device)
    starts = range(0, g_flat.numel(), step)
    # float64 tensors in float64, every other dtype in float32: the differences judged are
    # >= 1e-6 relative (fp32 tolerances), far above float32's rounding of them (6e-8), and
    # float32 halves the temporaries and the time of a float64 pass (measured 2x on CPU).
    work = torch.float64 if torch.float64 in (got.dtype, ref.dtype) else torch.float32
    zero = torch.zeros((), dtype=torch.float64, device=g_flat.device)
    max_abs, max_ref, ratio = zero.clone(), zero.clone(), zero.clone()
    dot, rr, gg = zero.clone(), zero.clone(), zero.clone()
    worst_at, worst_ratio = 0, -1.0
    for start in starts:
        g = g_flat[start:start + step].to(work)
        r = r_flat[start:start + step].to(work)
        # Two temporaries per chunk, reused in place: |ref| becomes the bound, |Δ| the ratio.
        r_abs = r.abs()
        chunk_ratio = (g - r).abs_()
        max_abs = torch.maximum(max_abs, chunk_ratio.max().double())
        max_ref = torch.maximum(max_ref, r_abs.max().double())
        chunk_ratio.div_(r_abs.mul_(tol.rtol).add_(tol.atol))
        top = chunk_ratio.max()
        ratio = torch.maximum(ratio, top.double())
        if project:
            # Sums accumulated in float64 across chunks (each chunk's in its working dtype).
            dot += torch.dot(g, r).double()
            rr += torch.dot(r, r).double()
            gg += torch.dot(g, g).double()
        # One host sync per chunk, for the evidence of where the worst element is.
        value = float(top)
        if not value <= worst_ratio:
            worst_ratio, worst_at = value, start + int(chunk_ratio.argmax())
        del g, r, r_abs, chunk_ratio
        if release is not None:
            release(start, start + step)
    rr_f, dot_f, gg_f = float(rr), float(dot), float(gg)
    residual = 0.0
    if project and rr_f > 0 and math.isfinite(rr_f):
        # Second pass, now that the factor is known: |got - f·ref| directly, not by cancellation.
        factor = dot_f / rr_f
        acc = zero.clone()
        for start in starts:
            d = g_flat[start:start + step].to(work) - factor * r_flat[start:start + step].to(work)
            acc += torch.dot(d, d).double()
            if release is not None:
                release(start, start + step)
        residual = math.sqrt(float(acc)) if float(acc) >= 0 else float(acc)
    m_abs, scale = float(max_abs), float(max_ref)
    worst_element = None
    if g_flat.numel():
        # Where it is in the tensor the user has: a row of a sparse gradient's table.
        at = worst_at if rows is None else int(rows.index[worst_at // rows.width]) * rows.width + worst_at % rows.width
        worst_element = (at, float(g_flat[worst_at]), float(r_flat[worst_at]))
    diff = TensorDiff(name, m_abs, m_abs / scale if scale > 0 else m_abs,
                      float(ratio) if g_flat.numel() else 0.0, tol, worst_element=worst_element,
                      ref_max=scale)
    if not project:
        # Finiteness from the maxima instead: with a finite reference, NaN/Inf in got reaches
        # the largest difference.
        finite = math.isfinite(m_abs) or not math.isfinite(scale)
        return Compared(diff, True, True, got_finite=finite, ref_finite=math.isfinite(scale))
    return Compared(diff, True, True, ref_sq=rr_f, dot=dot_f, got_sq=gg_f, residual=residual,
                    got_finite=math.isfinite(gg_f), ref_finite=math.isfinite(rr_f))


@dataclass(frozen=True)
class _Rows:
    """The rows of a sparse gradient's table that a comparison kept (``_densified``)."""

    index: Any  # 1-D: kept row i is row index[i] of the table
    width: int  # elements per row


def _densified(got: Any, ref: Any) -> tuple[Any, Any, _Rows | None]:
    """Two tensors of which one or both are sparse, as dense ones that compare alike.

    A sparse gradient of an embedding table (``EmbeddingBag(sparse=True)``: COO, one sparse
    dimension, the rows dense) becomes the rows either side touched, stacked: every other
    element is 0 on both sides, so the comparison's maxima, ratio and dot products are those
    of the whole tensor, without a dense copy of a table that may be most of the model
    (``_Rows`` maps a kept element back to its place). Any other sparse layout: densified whole.
    """
    import torch

    coo = all(t.layout == torch.sparse_coo and t.sparse_dim() == 1 for t in (got, ref))
    if not coo:
        return (got.to_dense() if got.layout != torch.strided else got,
                ref.to_dense() if ref.layout != torch.strided else ref, None)
    got, ref = got.detach().coalesce(), ref.detach().coalesce()
    index = torch.unique(torch.cat([got.indices()[0], ref.indices()[0]]))
    width = math.prod(got.shape[1:])

    def rows_of(t: Any) -> Any:
        out = torch.zeros((len(index), *t.shape[1:]), dtype=t.dtype, device=t.device)
        out[torch.searchsorted(index, t.indices()[0])] = t.values()
        return out

    return rows_of(got), rows_of(ref), _Rows(index, width)


def stored_values(tensor: Any) -> Any:
    """The values a sparse COO tensor stores, duplicates summed (a sparse gradient of an
    ``EmbeddingBag(sparse=True)`` repeats an index per lookup): its sums and norms are theirs,
    and ``torch.linalg.vector_norm`` has no sparse kernel. Any other tensor: itself."""
    import torch

    if getattr(tensor, "layout", None) == torch.sparse_coo:
        return tensor.detach().coalesce().values()
    return tensor


def _norm_sq(tensor: Any) -> tuple[float, bool]:
    """(sum of squares, all finite) of one tensor, chunk by chunk on its device."""
    import torch

    flat = stored_values(tensor).detach().reshape(-1)  # a sparse tensor's other elements are 0
    total = 0.0
    step = chunk_for(flat.device)
    for start in range(0, flat.numel(), step):
        total += float(torch.linalg.vector_norm(flat[start:start + step], dtype=torch.float64)) ** 2
    return total, math.isfinite(total)


def diff_tensor(name: str, got: Any, ref: Any, *, grad: bool) -> TensorDiff:
    """One tensor against its reference (see ``compare_tensor``)."""
    return compare_tensor(name, got, ref, grad=grad).diff


def diff_states(got: dict[str, Any], ref: dict[str, Any], *, grad: bool) -> list[TensorDiff]:
    """Every tensor of ``ref`` against ``got`` (names missing on one side are reported)."""
    names = list(ref) + [n for n in got if n not in ref]
    return [diff_tensor(n, got.get(n), ref.get(n), grad=grad) for n in names]


def worst(diffs: list[TensorDiff]) -> TensorDiff | None:
    return max(diffs, key=lambda d: d.judged_ratio, default=None)


def fmt(value: float) -> str:
    return "inf" if value == float("inf") else f"{value:.2g}" if value else "0"
