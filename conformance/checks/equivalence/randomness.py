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

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

# Defined beside the harness's other numerics switches, so a rank that only needs it (a
# resume-equivalence life, every life of it) does not import this whole package.
from ...harness.ddp import disable_dropout

__all__ = ["disable_dropout", "forward_is_random"]


@contextlib.contextmanager
def state_kept(model: Any, *, device: Any = None) -> Iterator[None]:
    """A probe's forwards leave the real run as it was: the global generators forked (CUDA's
    too: ``manual_seed`` seeds every device) and the buffers saved before and put back after
    (BatchNorm's running statistics move in a training forward). The buffers, not a deep copy
    of the model: a copy of every parameter cost more than the probe on a large model, and the
    probes never step an optimizer."""
    import torch

    saved = [(buf, buf.detach().clone()) for buf in model.buffers()]
    cuda = [device.index] if getattr(device, "type", "cpu") == "cuda" else []
    try:
        with torch.random.fork_rng(devices=cuda):
            yield
    finally:
        with torch.no_grad():
            for buf, value in saved:
                buf.copy_(value)


def forward_is_random(model: Any, run: Callable[[Any], Any], *, device: Any = None) -> bool:
    """Do two forwards of ``model`` under different seeds disagree?

    ``run(model)`` computes what the checks compare (the loss, or the outputs), under
    ``no_grad`` and :func:`state_kept`: neither the model's state nor the real run's
    generators move.
    """
    import torch

    results = []
    with state_kept(model, device=device), torch.no_grad():
        for seed in (1, 2):
            torch.manual_seed(seed)
            results.append([t.detach().cpu().double() for t in _tensors(run(model))])
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
