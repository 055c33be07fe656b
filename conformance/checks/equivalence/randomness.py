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
from .leaves import floating_tensors

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


def _generator_states(device: Any) -> list[Any]:
    """The default generators a forward on ``device`` can draw from: the CPU's, and the
    device's own on a GPU."""
    import torch

    states = [torch.random.get_rng_state()]
    if getattr(device, "type", "cpu") == "cuda":
        states.append(torch.cuda.get_rng_state(device))
    return states


def forward_is_random(model: Any, run: Callable[[Any], Any], *, device: Any = None) -> bool:
    """Does a forward of ``model`` draw random numbers: do two forwards under different seeds
    disagree, or does a forward advance a default generator at all?

    The second question because the first is asked at the initial weights, where a random op
    can leave no trace: DiT zero-initialises its output layers (adaLN-Zero), so its label
    dropout (``torch.rand`` in ``LabelEmbedder.token_drop``) changes nothing until the first
    step has moved them — and then every step draws other labels on N ranks than in one
    process. A generator that moved is the draw itself, whatever the weights. (Switched off,
    dropout draws nothing: ``p=0`` returns before sampling a mask, measured for ``nn.Dropout``,
    ``nn.MultiheadAttention`` and ``scaled_dot_product_attention``.)

    ``run(model)`` computes what the checks compare (the loss, or the outputs), under
    ``no_grad`` and :func:`state_kept`: neither the model's state nor the real run's
    generators move.
    """
    import torch

    results, drew = [], False
    with state_kept(model, device=device), torch.no_grad():
        for seed in (1, 2):
            torch.manual_seed(seed)
            before = _generator_states(device)
            results.append([t.detach().cpu().double() for t in floating_tensors(run(model))])
            drew = drew or any(not torch.equal(a, b) for a, b in zip(before, _generator_states(device)))
    if drew:
        return True
    a, b = results
    # equal_nan: a forward that returns NaN twice is not random (it is non-finite, judged apart).
    return len(a) != len(b) or any(x.shape != y.shape or not torch.allclose(x, y, rtol=0, atol=0, equal_nan=True)
                                   for x, y in zip(a, b))


