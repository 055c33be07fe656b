"""Randomness in forward (dropout and the like): found, switched off, and said so.

An N-rank run and its single-process reference cannot draw the same dropout masks: each rank
draws masks for its own shard from its own generator, the reference draws one mask for the
whole batch. With dropout active, equivalence is impossible *by construction*, and a mismatch
says nothing about DDP. So both sides run with dropout switched off — every ``nn.Dropout*``
module and every float ``dropout`` attribute (``nn.MultiheadAttention``, GPT-style attention
passing ``dropout_p=self.dropout``) set to 0 — and a probe then checks that two forwards on
the same input under different seeds agree. What was switched off, and whether randomness
remains, goes into the record.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# Defined beside the harness's other numerics switches, so a rank that only needs it (a
# resume-equivalence life, every life of it) does not import this whole package.
from ...harness.ddp import disable_dropout

__all__ = ["disable_dropout", "forward_is_random"]


def forward_is_random(model: Any, run: Callable[[Any], Any], *, device: Any = None) -> bool:
    """Do two forwards of ``model`` under different seeds disagree?

    ``run(model)`` computes what the checks compare (the loss, or the outputs). Under
    ``no_grad`` and ``fork_rng``, with the buffers saved before and put back after (BatchNorm's
    running statistics move in a training forward): neither the model's state nor the global
    generator of the real run move. The buffers, not a deep copy of the model: a copy of every
    parameter cost more than both forwards on a large model, and no_grad forwards leave the
    parameters alone.
    """
    import torch

    saved = [(buf, buf.detach().clone()) for buf in model.buffers()]
    results = []
    # manual_seed seeds every device: fork the CUDA generator too, or the probe would move it.
    cuda = [device.index] if getattr(device, "type", "cpu") == "cuda" else []
    try:
        with torch.random.fork_rng(devices=cuda), torch.no_grad():
            for seed in (1, 2):
                torch.manual_seed(seed)
                results.append([t.detach().cpu().double() for t in _tensors(run(model))])
    finally:
        with torch.no_grad():
            for buf, value in saved:
                buf.copy_(value)
    a, b = results
    # equal_nan: a forward that returns NaN twice is not random (it is non-finite, judged apart).
    return len(a) != len(b) or any(x.shape != y.shape or not torch.allclose(x, y, rtol=0, atol=0, equal_nan=True)
                                   for x, y in zip(a, b))


def _tensors(value: Any) -> list[Any]:
    """Every floating tensor in a (nested) forward result, in order."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value] if value.is_floating_point() else []
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []
