"""Silent data corruption as faults: a wrong bit in what one rank computed or received.

A faulty core or GPU returns a wrong number without an error (docs/node-health.md,
"What a node fault looks like"). These faults reproduce it, deterministically, at a "tensor" site
(:class:`~faults.sites.Site`): the value a rank just computed, offered by the node-health
check's rank side before anything reads it.

- :class:`BitFlip` — one chosen bit (the sign, the lowest exponent bit, the lowest mantissa
  bit, or an explicit bit index) of one element of one rank's module output
  (``"output:<module>"``) or one parameter's gradient (``"grad:<parameter>"``), at chosen
  steps (``steps``; None: every time).
- :class:`CorruptAllReduce` — the same flip in one element of one all-reduced bucket
  (``"bucket:<index>"``) on one rank, after the collective: corruption on the wire or in the
  reduction, not in compute.

The flip is exact (an integer XOR on the element's bit pattern, never arithmetic) and its
record says the value before and after and whether the value changed at all (flipping the sign
of a zero changes the bits, not the value).

    BitFlip(rank=2, tensor="output:0", bit="mantissa", steps=(1,)).fires(2, 1, "forward")
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from .sites import Site

__all__ = ["BIT_CLASSES", "BitFlip", "CorruptAllReduce", "bit_index", "flipped"]

#: The bit classes a flip names, lowest to most visible: the lowest mantissa bit (one ulp),
#: the lowest exponent bit (the value doubled or halved), the sign.
BIT_CLASSES = ("mantissa", "exponent", "sign")
#: Which phase a labelled value belongs to: outputs are computed in forward, gradients and
#: all-reduced buckets in backward.
_PHASE = {"output": "forward", "grad": "backward", "bucket": "backward"}


def _steps(value: Iterable[int] | None) -> tuple[int, ...] | None:
    return None if value is None else tuple(int(s) for s in value)


def bit_index(dtype: Any, bit: str | int) -> int:
    """The bit that ``bit`` names in ``dtype``'s layout: "sign" is the top bit, "exponent" the
    lowest exponent bit (just above the mantissa), "mantissa" bit 0; an int is taken as is."""
    import torch

    width = torch.empty((), dtype=dtype).element_size() * 8
    if isinstance(bit, int):
        if not 0 <= bit < width:
            raise ValueError(f"bit={bit} is outside a {width}-bit {dtype}")
        return bit
    if bit == "sign":
        return width - 1
    if bit == "exponent":
        # eps is 2**-mantissa_bits: the lowest exponent bit sits just above the mantissa.
        return round(-math.log2(torch.finfo(dtype).eps)) if dtype.is_floating_point else width - 2
    if bit == "mantissa":
        return 0
    raise ValueError(f"bit={bit!r} is not one of {', '.join(BIT_CLASSES)} or a bit index")


_INT_OF_WIDTH = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}
_FLIP: Any = None


def _flip_function() -> Any:
    """The autograd function that flips one bit of one element: forward returns a copy with the
    bit flipped, backward passes the gradient through unchanged (a faulty core corrupts the value
    the next layer reads; the chain rule itself is not what fails). Built on first use, so that
    importing the faults needs no torch."""
    global _FLIP
    if _FLIP is None:
        import torch

        class _Flip(torch.autograd.Function):
            @staticmethod
            def forward(ctx: Any, x: Any, element: int, bit: int) -> Any:
                out = x.detach().clone(memory_format=torch.contiguous_format)
                ints = out.view(-1).view(getattr(torch, _INT_OF_WIDTH[out.element_size()]))
                width = out.element_size() * 8
                # The top bit of a signed integer is its sign: the mask is the negative number
                # with only that bit set, so the XOR stays within the integer's range.
                mask = -(1 << bit) if bit == width - 1 and width > 8 else 1 << bit
                ints[element] = ints[element] ^ mask
                return out

            @staticmethod
            def backward(ctx: Any, grad: Any) -> Any:
                return grad, None, None

        _FLIP = _Flip
    return _FLIP


def flipped(tensor: Any, element: int, bit: str | int) -> tuple[Any, dict[str, Any]]:
    """``tensor`` with one bit of its ``element``-th element (flat index) flipped, and the record
    of the flip (element, bit, value before and after, whether the value changed)."""
    n = tensor.numel()
    if not 0 <= element < n:
        raise ValueError(f"element={element} is outside a tensor of {n} elements")
    index = bit_index(tensor.dtype, bit)
    out = _flip_function().apply(tensor, element, index)
    before = tensor.detach().reshape(-1)[element].item()
    after = out.detach().reshape(-1)[element].item()
    return out, {"element": element, "bit": bit, "bit_index": index, "before": before, "after": after,
                 "value_changed": bool(before != after) and not (before != before and after != after)}


def _check_label(label: str, kinds: tuple[str, ...]) -> None:
    kind, sep, name = label.partition(":")
    if not sep or kind not in kinds or not name:
        raise ValueError(f"tensor={label!r} is not '<kind>:<name>' with kind in {', '.join(kinds)} "
                         f"(e.g. 'output:fc1', 'grad:fc1.weight')")


@dataclass(frozen=True, slots=True)
class BitFlip:
    """One bit of one element of one value on one rank: silent corruption in compute."""

    rank: int
    tensor: str  # "output:<module name>" (the whole model: "output:(model)") or "grad:<parameter name>"
    bit: str | int = "mantissa"
    element: int = 0
    steps: tuple[int, ...] | None = None  # None: every time (persistent); (s,): once
    name: str = "bit-flip"

    def __post_init__(self) -> None:
        _check_label(self.tensor, ("output", "grad"))
        if isinstance(self.bit, str) and self.bit not in BIT_CLASSES:
            raise ValueError(f"bit={self.bit!r} is not one of {', '.join(BIT_CLASSES)} or a bit index")
        if self.element < 0:
            raise ValueError(f"element={self.element} must be a flat index (0 or more)")
        object.__setattr__(self, "steps", _steps(self.steps))

    @property
    def phase(self) -> str:
        return _PHASE[self.tensor.partition(":")[0]]

    def fires(self, rank: int, step: int, phase: str) -> bool:
        return rank == self.rank and phase == self.phase and (self.steps is None or step in self.steps)

    def inject(self, site: Site) -> bool:
        """At the "tensor" site labelled ``tensor`` where it fires: the value with the bit flipped."""
        if site.kind != "tensor" or site.label != self.tensor or not self.fires(site.rank, site.step, site.phase):
            return False
        site.tensor, record = flipped(site.tensor, self.element, self.bit)
        site.mark(self, tensor=self.tensor, **record)
        return True


@dataclass(frozen=True, slots=True)
class CorruptAllReduce:
    """One element of one all-reduced bucket wrong on one rank: corruption on the wire or in
    the collective. The rank's own gradients were right; what came back was not."""

    rank: int
    bucket: int = 0
    bit: str | int = "exponent"
    element: int = 0
    steps: tuple[int, ...] | None = None
    name: str = "corrupt-allreduce"

    def __post_init__(self) -> None:
        if self.bucket < 0 or self.element < 0:
            raise ValueError(f"bucket={self.bucket}, element={self.element} must be indices (0 or more)")
        if isinstance(self.bit, str) and self.bit not in BIT_CLASSES:
            raise ValueError(f"bit={self.bit!r} is not one of {', '.join(BIT_CLASSES)} or a bit index")
        object.__setattr__(self, "steps", _steps(self.steps))

    @property
    def label(self) -> str:
        return f"bucket:{self.bucket}"

    def fires(self, rank: int, step: int, phase: str = "backward") -> bool:
        return rank == self.rank and phase == "backward" and (self.steps is None or step in self.steps)

    def inject(self, site: Site) -> bool:
        """At the "tensor" site of the bucket's all-reduced result where it fires: one bit flipped."""
        if site.kind != "tensor" or site.label != self.label or not self.fires(site.rank, site.step, site.phase):
            return False
        site.tensor, record = flipped(site.tensor, self.element, self.bit)
        site.mark(self, bucket=self.bucket, **record)
        return True
