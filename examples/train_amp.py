"""Example target: a small transformer classifier trained under bf16 autocast with AdamW and
GradScaler-style loss scaling, wrapped for the suite.

    ddp-conformance run --target examples/train_amp.py --report-dir out/amp
    ddp-conformance run --target examples/train_amp.py --checks gradient-equivalence,no-sync-equivalence
    torchrun --nproc-per-node 2 -m conformance run --attach --target examples/train_amp.py

The pattern of mixed-precision training code: ``torch.autocast`` around the forward and the
loss (matmuls in bfloat16, parameters and their gradients stay float32), a ``GradScaler``
that multiplies the loss before backward and divides the gradients back before the step
(``unscale_``, then clipping, then ``scaler.step`` — which skips the step when a gradient is
inf/NaN — and ``scaler.update``), AdamW with weight decay, and gradient accumulation with
``no_sync`` on all but the last microbatch, the loss divided by the accumulation steps.

bf16 rounds every matmul to 8 mantissa bits: a rank computing on its shard and one process
computing on the whole batch differ by ~1e-3 of a gradient's scale for reasons that have
nothing to do with DDP. The suite measures that noise floor on this very configuration (a
single-process twin run on the N-rank run's microbatches; docs/numerics.md) and judges the DDP
difference against it; a loss multiplied by the world size still differs by 100 % and is caught.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

VOCAB, WIDTH, HEADS, SEQ, CLASSES = 64, 32, 4, 8, 5
AUTOCAST_DTYPE = torch.bfloat16
GRAD_CLIP = 1.0

ddp_kwargs = {"find_unused_parameters": False}
global_batch_size = 16


class Classifier(nn.Module):
    """Token embedding + positional embedding, one pre-norm encoder layer, mean-pooled head."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.position = nn.Parameter(torch.randn(SEQ, WIDTH) * 0.02)
        self.encoder = nn.TransformerEncoderLayer(WIDTH, HEADS, dim_feedforward=2 * WIDTH,
                                                  dropout=0.0, batch_first=True, norm_first=True)
        self.head = nn.Linear(WIDTH, CLASSES)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.encoder(self.embed(tokens) + self.position)
        return self.head(hidden.mean(dim=1))


def build_model() -> nn.Module:
    return Classifier()


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = torch.randint(0, VOCAB, (batch_size, SEQ), generator=generator)
    # A learnable label: the most frequent token class of the sequence.
    return tokens, (tokens % CLASSES).mode(dim=1).values


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs.float(), targets)


def build_optimizer(model: nn.Module) -> torch.optim.Optimizer:
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and n != "position"]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2 or n == "position"]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                              {"params": rest, "weight_decay": 0.0}], lr=1e-3)


# One scaler per optimizer, as training code keeps it beside its optimizer; keyed weakly by
# the optimizer so that two runs in one process (the N-rank run and the single-process
# reference) never share a scale, and a finished run's scaler goes with its optimizer.
_SCALERS: weakref.WeakKeyDictionary[torch.optim.Optimizer, torch.amp.GradScaler] = (
    weakref.WeakKeyDictionary())


def _scaler(optimizer: torch.optim.Optimizer) -> torch.amp.GradScaler:
    if optimizer not in _SCALERS:
        _SCALERS[optimizer] = torch.amp.GradScaler("cpu", init_scale=2.0 ** 12)
    return _SCALERS[optimizer]


def train_step(model: Any, optimizer: torch.optim.Optimizer, microbatches: list[Any],
               loss_fn: Any) -> None:
    scaler = _scaler(optimizer)
    optimizer.zero_grad(set_to_none=True)
    k = len(microbatches)
    for i, (tokens, labels) in enumerate(microbatches):
        # Only the last backward of the window all-reduces (nanoGPT's toggle, no context).
        model.require_backward_grad_sync = i == k - 1
        with torch.autocast("cpu", dtype=AUTOCAST_DTYPE):
            loss = loss_fn(model(tokens), labels) / k
        scaler.scale(loss).backward()
    # Unscale before clipping: the clip threshold is in the gradients' true units.
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
    scaler.step(optimizer)
    scaler.update()
