"""The loss at the initial weights, on each rank and in the reference: what the forward computes.

Both sides start from the same weights. There the mean of the N ranks' losses on their
shards is the single-process loss on the whole batch for a loss that is a mean over samples
— also for a contrastive loss whose negatives are gathered from every rank, and for one
normalised by a count all-reduced over the ranks. So, before the first step (``gradient-
equivalence``: one microbatch per rank), every rank computes the target's loss on its shard
in the real N-rank world (its collectives included: every rank computes it, in the same
order), under ``no_grad`` and ``randomness.state_kept`` (the run does not move), and the
reference computes it on the whole batch. Recorded:

- ``value``: the loss;
- ``cross_entropy``: each ``cross_entropy``/``nll_loss`` the loss called (seen through a
  ``TorchFunctionMode`` for this forward only: no patch, nothing during the training steps),
  as (rows, columns, offset): its logits' shape and, when its targets are
  ``arange(rows) + offset`` (positives on a diagonal: a contrastive loss), that offset.

What it tells (``collective_causes``): equal losses with unequal gradients put the bug in the
backward (a collective autograd does not see, a gather layer's backward); unequal losses put
it in the forward — targets on the local diagonal of a gathered matrix on a rank > 0 (labels
not offset by rank), or a single-process loss that is a weighted mean of the ranks' losses
but not their plain mean (a normaliser counted per rank).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypedDict


class CrossEntropyCall(TypedDict):
    rows: int
    columns: int
    offset: int | None  # targets == arange(rows) + offset; None: not a diagonal


class StartLoss(TypedDict):
    value: float
    cross_entropy: list[CrossEntropyCall]


def _diagonal(logits: Any, targets: Any) -> CrossEntropyCall | None:
    import torch

    if not (isinstance(logits, torch.Tensor) and isinstance(targets, torch.Tensor)) or logits.dim() != 2:
        return None
    rows, columns = int(logits.shape[0]), int(logits.shape[1])
    offset = None
    if targets.dim() == 1 and not targets.is_floating_point() and targets.numel() == rows and rows:
        first = int(targets[0])
        if torch.equal(targets.cpu(), torch.arange(rows) + first):
            offset = first
    return CrossEntropyCall(rows=rows, columns=columns, offset=offset)


def start_loss(model: Any, loss: Callable[[Any], Any], *, device: Any = None) -> StartLoss | None:
    """``loss(model)`` once, at the current weights, observed (module docstring); None when it
    returns no scalar."""
    import torch
    from torch.nn import functional as F
    from torch.overrides import TorchFunctionMode

    from .randomness import state_kept

    calls: list[CrossEntropyCall] = []

    class Watch(TorchFunctionMode):
        def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
            if func in (F.cross_entropy, F.nll_loss) and len(args) >= 2:
                seen = _diagonal(args[0], args[1])
                if seen is not None:
                    calls.append(seen)
            return func(*args, **(kwargs or {}))

    with state_kept(model, device=device), torch.no_grad(), Watch():
        value = loss(model)
    if not isinstance(value, torch.Tensor) or value.numel() != 1:
        return None
    return StartLoss(value=float(value.detach().double()), cross_entropy=calls)


def measure_start_loss(model: Any, target: Any, microbatch: Any, *, device: Any = None) -> StartLoss | None:
    """``start_loss`` of ``target``'s loss on ``microbatch`` (this rank's one microbatch, or the
    reference's whole batch), eager, leaving BatchNorm's recorded sizes as the run made them."""
    from .compiled import run_eagerly
    from .normalisation import sizes_kept

    with run_eagerly(), sizes_kept(model):
        return start_loss(model, lambda m: target.compute_loss(m, *microbatch), device=device)
