"""Judging "equal within a dtype tolerance": per-tensor differences and the worst offender.

Never bitwise: DDP sums gradients in bucket order and ``bucket_cap_mb`` changes that order,
so a correct run differs from the reference in the last bits. A difference passes when
``|got - ref| <= atol + rtol * |ref|`` element-wise (numpy.allclose's rule).

Tolerances, measured (CPU, fp32, gloo, 2 ranks, torch 2.13; built-in targets and the correct
targets of tests/targets, SGD and Adam, 3 steps; K=1 and K=4): correct runs differ from the
1-rank reference by at most 1.4e-6 absolute / 6.3e-7 relative in first-step gradients (the
tied LM, whose gradients reach ~2; the MLPs: 1.5e-8 / 2.1e-7) and by at most 1.3e-7 absolute /
1.0e-6 relative in parameters. A loss scaled by the world size gives a relative gradient error
of 1.0 (2 ranks), SGD parameter errors ~6e-2, Adam parameter errors only ~1e-7..1e-4 (Adam
normalises the update: the gradient shows the bug, the parameters barely do). Hence fp32
gradients atol 1e-6 + rtol 1e-5 (the worst correct run uses 0.09 of it; the smallest real error
is ~1e4 times over it) and fp32 parameters atol 1e-5 + rtol 1e-4. Other dtypes scale those by
their machine epsilon relative to fp32's (bf16 7.8e-3, fp16 9.8e-4, fp64 2.2e-16): not measured
on this machine, and said so.
"""

from __future__ import annotations

from dataclasses import dataclass
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


def tolerance_for(dtype: Any, *, grad: bool) -> Tolerance:
    name = str(dtype).replace("torch.", "")
    params, grads = TOLERANCES.get(name, TOLERANCES["float32"])
    return grads if grad else params


@dataclass(frozen=True, slots=True)
class TensorDiff:
    name: str
    max_abs: float
    max_rel: float  # max |got - ref| / max |ref|: scale-free, robust to zeros in ref
    ratio: float  # worst |got - ref| / (atol + rtol |ref|): > 1 means outside tolerance
    tolerance: Tolerance
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.ratio <= 1.0

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "max_abs": self.max_abs, "max_rel": self.max_rel,
                "ratio": round(self.ratio, 4), "atol": self.tolerance.atol,
                "rtol": self.tolerance.rtol, **({"note": self.note} if self.note else {})}


def diff_tensor(name: str, got: Any, ref: Any, *, grad: bool) -> TensorDiff:
    """One tensor against its reference. A missing tensor on one side is infinitely wrong."""
    tol = tolerance_for(getattr(ref if ref is not None else got, "dtype", "float32"), grad=grad)
    if got is None and ref is None:
        return TensorDiff(name, 0.0, 0.0, 0.0, tol, "no gradient on either side")
    if got is None or ref is None:
        side = "DDP run" if got is None else "reference"
        return TensorDiff(name, float("inf"), float("inf"), float("inf"), tol,
                          f"gradient missing in the {side}")
    if tuple(got.shape) != tuple(ref.shape):
        return TensorDiff(name, float("inf"), float("inf"), float("inf"), tol,
                          f"shape {tuple(got.shape)} != reference {tuple(ref.shape)}")
    g, r = got.double(), ref.double()
    delta = (g - r).abs()
    max_abs = float(delta.max()) if delta.numel() else 0.0
    scale = float(r.abs().max()) if r.numel() else 0.0
    bound = tol.atol + tol.rtol * r.abs()
    ratio = float((delta / bound).max()) if delta.numel() else 0.0
    return TensorDiff(name, max_abs, max_abs / scale if scale > 0 else max_abs, ratio, tol)


def diff_states(got: dict[str, Any], ref: dict[str, Any], *, grad: bool) -> list[TensorDiff]:
    """Every tensor of ``ref`` against ``got`` (names missing on one side are reported)."""
    names = list(ref) + [n for n in got if n not in ref]
    return [diff_tensor(n, got.get(n), ref.get(n), grad=grad) for n in names]


def worst(diffs: list[TensorDiff]) -> TensorDiff | None:
    return max(diffs, key=lambda d: d.ratio, default=None)


def fmt(value: float) -> str:
    return "inf" if value == float("inf") else f"{value:.2g}" if value else "0"
