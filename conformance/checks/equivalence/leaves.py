"""The floating tensors in a (nested) forward result or module call, in order: what the
randomness probe compares and the mixing probe fingerprints."""

from __future__ import annotations

from typing import Any


def floating_tensors(value: Any) -> list[Any]:
    """Every floating tensor in ``value`` (a tensor, or dicts, tuples and lists of them), in
    order; anything else is skipped."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() else []
    if isinstance(value, dict):
        return [t for v in value.values() for t in floating_tensors(v)]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in floating_tensors(v)]
    return []
