"""The start of the sensitivity run (``sensitivity``): the reference's initial weights moved by
the last bits rounding leaves after a step. Rank side, before wrapping."""

from __future__ import annotations

from typing import Any


def nudge(model: Any, *, ulps: int) -> None:
    """Every floating parameter element ``ulps`` ulps up (towards +inf): a difference of the size
    rounding leaves after a step, everywhere at once (rank side, before wrapping). 0: untouched."""
    import torch

    with torch.no_grad():
        for p in model.parameters():
            for _ in range(ulps if p.is_floating_point() else 0):
                p.copy_(torch.nextafter(p, torch.full_like(p, float("inf"))))
