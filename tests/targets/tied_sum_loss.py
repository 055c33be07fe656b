"""BROKEN: the tied language model with its cross-entropy summed over tokens, not averaged
(jadore801120/attention-is-all-you-need-pytorch's train.py sums its label-smoothed loss the
same way). Under DDP every gradient is 1/N of the large-batch one, the tied weight's no more
than any other: shared-weights must name the loss, not the sharing.

    ddp-conformance run --target tests/targets/tied_sum_loss.py --checks shared-weights
"""

from __future__ import annotations

import torch
from torch import nn

from conformance.targets.tied_lm import build_model, ddp_kwargs, make_batch  # noqa: F401


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    # the bug: reduction='sum' (each rank's gradient grows with its share of the batch)
    return nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), reduction="sum")
