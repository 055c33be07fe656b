"""Parameters after an adaptive optimizer's steps, and the gradients of every step.

Adam and AdamW normalise each element's update: ``lr · m̂ / (√v̂ + eps)`` is at most ~lr
whatever the gradient's size. An element whose gradient is rounding noise (a key bias inside
softmax attention has a gradient of exactly 0 in theory; ``eps=1e-9`` makes even 1e-12 count)
moves by up to lr in a direction the last bits decide, so a correct DDP run and its
single-process reference differ there by up to 2·lr per step *whatever the gradients' floor*.
The floor's twin samples that tail once and can sit under the DDP run's draw (measured: a
Transformer with ``eps=1e-9`` failed "parameters diverge from step 2 … by 1.6e-05" while its
gradients matched). So under Adam/AdamW the parameters are judged against the update rule's own
bound, and the gradients, which the update rule cannot hide, are judged at every step:

- **The optimizer's floor** (``update_bound``, rank side, at each ``optimizer.step()``): the
  largest ``|m̂_t / √v̂_t|`` any gradient history allows after ``t`` steps (Cauchy-Schwarz over
  the two moving averages: exactly 1 at the first step, ~1.05 at the third with the common betas),
  times the largest learning rate. After step ``s`` two runs may differ by ``2 · Σ_t lr_t · ρ_t``
  per element (``parameter_floor``): a bound no gradient difference can exceed, so it never
  passes what the gradients show.
- **The gradients of every step** (``gradient_norms``): each parameter's gradient norm as
  ``optimizer.step()`` consumed it, at every step, on every side. The first step's gradients
  are compared tensor by tensor (``experiment``); later steps start from parameters that
  already differ in that noise, so their norms are compared (``judge_later``): relative to the
  step's largest norm, within the fixed gradient rtol or ``floor.MARGIN ×`` the twin's own difference
  at that step, never tighter than a tenth of the least visible scaling bug (``LATER_SHARE``). A loss scaled by N from the second step on moves them by 1.0 (measured: a
  Transformer with Adam, 2 ranks); a correct run by < 1e-5 of the scale, through 3 steps (the
  twin's 4-microbatch run: 1.5e-8, 3e-8, 3e-8; a fourth step 6.8e-6, after a ReLU flipped).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from .hypotheses import NEGLIGIBLE, SPREAD
from .schedule import rate_of
from .tensors import fmt
from .wide_sums import norm64

#: Optimizers whose update is ``lr · m̂ / (√v̂ + eps)`` per element (subclasses included).
ADAPTIVE = ("Adam", "AdamW")


def _ratio_bound(step: int, beta1: float, beta2: float) -> float:
    """The largest ``|m̂_t| / √v̂_t`` over every gradient history of ``step`` steps.

    ``m_t = Σ a_i g_i`` and ``v_t = Σ b_i g_i²`` with ``a_i = (1-β1)β1^(t-i)`` and
    ``b_i = (1-β2)β2^(t-i)``; by Cauchy-Schwarz ``|m_t| ≤ √(Σ a_i²/b_i) · √v_t``, and the bias
    corrections divide by ``1-β1^t`` and ``1-β2^t``."""
    q = beta1 * beta1 / beta2
    series = step if q == 1 else (1 - q ** step) / (1 - q)
    return math.sqrt((1 - beta1) ** 2 / (1 - beta2) * series) * math.sqrt(1 - beta2 ** step) / (1 - beta1 ** step)


def update_bound(optimizer: Any) -> float | None:
    """The largest change one ``optimizer.step()`` about to run can make to an element,
    whatever its gradient, or None (not an adaptive optimizer: its update scales with the
    gradient, and the twin's floor covers it). Read in the step pre-hook: the step count is
    the one before this step."""
    if not any(cls.__name__ in ADAPTIVE and cls.__module__.startswith("torch.optim")
               for cls in type(optimizer).__mro__):
        return None
    bound = 0.0
    for group in optimizer.param_groups:
        beta1, beta2 = (float(b) for b in group["betas"])
        done = [float(s["step"]) for p in group["params"] if (s := optimizer.state.get(p)) and "step" in s]
        step = int(max(done, default=0.0)) + 1
        bound = max(bound, rate_of(group["lr"]) * _ratio_bound(step, beta1, beta2))
    return bound


def parameter_floor(bounds: list[float | None] | None) -> list[float] | None:
    """Per step, how far two runs of the same adaptive optimizer may part per element (both
    moving the other way at every step so far): None unless every step that stepped was
    adaptive."""
    if not bounds or any(b is None for b in bounds):
        return None
    out, total = [], 0.0
    for b in bounds:
        total += 2.0 * float(b or 0.0)
        out.append(total)
    return out


def gradient_norms(named: list[tuple[str, Any]]) -> dict[str, float | None]:
    """Each parameter's gradient norm (None: no gradient), in float64 (``wide_sums``)."""
    return {name: None if g is None else norm64(g) for name, g in named}


@dataclass(frozen=True, slots=True)
class LaterStep:
    """One later step's gradient norms against the reference's."""

    step: int
    tensor: str  # the parameter whose norm differs most
    got: float
    ref: float
    rel: float  # |got - ref| / the step's largest reference norm
    bound: float  # what the step allows: the fixed rtol or MARGIN x the twin's difference
    rank: int
    factors: tuple[float, float] = (1.0, 1.0)  # that rank's norm ratios, over non-negligible norms

    @property
    def factor(self) -> float | None:
        """One norm ratio on every parameter (within ``hypotheses.SPREAD``), or None."""
        low, high = self.factors
        return (low + high) / 2 if low > 0 and high / low - 1 < SPREAD else None

    @property
    def ok(self) -> bool:
        return self.rel <= self.bound

    def message(self) -> str:
        return (f"the gradients optimizer.step() consumed at step {self.step} differ from the "
                f"single-process step's: the norm of {self.tensor!r}'s gradient is {self.got:.4g} on "
                f"rank {self.rank} but {self.ref:.4g} in the reference ({fmt(self.rel)} of the step's "
                f"gradient scale, bound {fmt(self.bound)})")

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "tensor": self.tensor, "got": self.got, "ref": self.ref,
                "rel": self.rel, "bound": self.bound, "rank": self.rank, "ok": self.ok,
                "norm_ratio_range": list(self.factors)}


def _worst(norms: list[dict[str, float | None] | None], ref: list[dict[str, float | None] | None],
           step: int) -> tuple[float, str, float, float] | None:
    """(rel, tensor, got, ref) of the largest norm difference at ``step``, or None."""
    if step >= len(norms) or step >= len(ref) or not norms[step] or not ref[step]:
        return None
    mine, theirs = norms[step] or {}, ref[step] or {}
    scale = max((v for v in theirs.values() if v is not None), default=0.0)
    if not scale > 0:
        return None
    top: tuple[float, str, float, float] | None = None
    for name, r in theirs.items():
        g = mine.get(name)
        if r is None or g is None:
            continue
        rel = abs(g - r) / scale
        if top is None or not rel <= top[0]:
            top = (rel, name, g, r)
    return top


def _ratios(mine: dict[str, float | None], ref: dict[str, float | None]) -> tuple[float, float]:
    """(lowest, highest) norm ratio over the parameters whose reference norm is not negligible."""
    top = max((r for r in ref.values() if r is not None), default=0.0)
    ratios = [g / r for name, r in ref.items() if r is not None and r > NEGLIGIBLE * top
              and (g := mine.get(name)) is not None]
    return (min(ratios), max(ratios)) if ratios else (1.0, 1.0)


#: A later step's gradients are computed at parameters that already differ within their own
#: tolerance, and the twin's run need not drift as far as the ranks' (its split is another):
#: seen on simsiam (SGD with momentum, BatchNorm grouped), step 2 off by 4.8e-5 of the scale on a
#: correct trainer, the twin's difference far below. So a later step is held to a tenth of the
#: least visible scaling bug the checks name (``floor.smallest_bug``: 0.05 at N=2), which still
#: catches every such bug (a factor is off by at least the bug itself) and not rounding's drift.
LATER_SHARE = 0.1


def judge_later(reference: dict[str, Any], ranks: list[dict[str, Any]], twin: dict[str, Any] | None,
                *, first: int, rtol: float, margin: float, smallest_bug: float,
                at_least: float = 0.0) -> list[LaterStep]:
    """The largest gradient-norm difference of every step after the first compared one
    (``first``: the step whose tensors were compared), worst rank, judged within ``rtol`` or
    ``margin`` x the twin's difference at that step, or ``at_least`` (a comm hook's compression
    bound), and never tighter than ``LATER_SHARE`` x ``smallest_bug``. A twin whose difference would admit
    ``smallest_bug`` (``floor.smallest_bug``) measured the split, not noise, and widens nothing."""
    ref = reference.get("grad_norms") or []
    out = []
    for step in range(first + 1, len(ref)):
        found = [(w, rank) for rank, v in enumerate(ranks)
                 if (w := _worst(v.get("grad_norms") or [], ref, step)) is not None]
        if not found:
            continue
        (rel, name, got, want), rank = max(found, key=lambda f: f[0][0])
        factors = _ratios((ranks[rank].get("grad_norms") or [])[step] or {}, ref[step] or {})
        twin_top = _worst((twin or {}).get("grad_norms") or [], ref, step)
        measured = margin * twin_top[0] if twin_top else 0.0
        allowed = max(rtol, at_least, LATER_SHARE * smallest_bug, measured if measured < smallest_bug else 0.0)
        out.append(LaterStep(step, name, got, want, rel, allowed, rank, factors))
    return out


def beyond_rtol(reference: dict[str, Any], ranks: list[dict[str, Any]], *, first: int, rtol: float) -> bool:
    """Does a later step's gradient norm differ beyond ``rtol`` (then the twin is needed)?"""
    return any(not s.ok for s in judge_later(reference, ranks, None, first=first, rtol=rtol,
                                            margin=0.0, smallest_bug=0.0))
