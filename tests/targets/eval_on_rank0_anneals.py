"""BROKEN: the word-language-model example's epoch loop under DDP, with its evaluation on rank 0
only. Training is a hand-written SGD update (``p -= lr * p.grad``, no optimizer object); after
every window rank 0 alone evaluates on a held-out set and, as the example does, anneals the
learning rate (``lr /= 4``) when the validation loss did not improve. Only rank 0's ``lr``
changes, so from the next update on rank 0's parameters part from rank 1's although every
gradient was averaged. rank-consistency's mid-run look must fail and name what it measured:
rank 0 ran forward passes outside training that rank 1 did not.

The held-out targets are the training targets negated, so training makes the validation loss
worse and the learning rate is annealed at the second evaluation, deterministically.
``epoch_loop``'s arguments make the other variants (``eval_on_every_rank.py``,
``eval_on_rank0_logged.py``: correct; ``eval_on_rank0_all_reduce.py``: broken).

    ddp-conformance run --target tests/targets/eval_on_rank0_anneals.py --checks rank-consistency
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from conformance.targets.mlp import OUT, build_model, loss_fn  # noqa: F401

LR = 0.5


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A learnable relation (the targets are the inputs' first columns), so training improves
    the training loss and worsens the negated held-out one."""
    inputs = torch.randn(batch_size, 16, generator=generator)
    return inputs, inputs[:, :OUT].clone()


def validation_loss(model: Any, device: Any, *, share_loss: bool) -> float:
    """The mean loss over 3 held-out batches; ``share_loss``: all_reduced (averaged over ranks)."""
    model.eval()
    generator = torch.Generator().manual_seed(1234)
    total = torch.zeros((), device=device)
    with torch.no_grad():
        for _ in range(3):
            inputs, targets = make_batch(generator, 4)
            total += loss_fn(model(inputs.to(device)), -targets.to(device))
    if share_loss:
        dist.all_reduce(total)
        total /= dist.get_world_size()
    model.train()
    return float(total) / 3


def epoch_loop(ctx: Any, *, eval_ranks: tuple[int, ...] | None, share_loss: bool = False,
               anneals: bool = True) -> None:
    """Train ``ctx.steps`` windows, each followed by an evaluation on ``eval_ranks`` (None: every
    rank) that anneals the learning rate when the loss did not improve (``anneals``)."""
    model = ctx.wrap(build_model())
    lr, best = LR, None
    generator = torch.Generator().manual_seed(ctx.rank)
    for _ in range(ctx.steps):
        inputs, targets = make_batch(generator, 4)
        model.zero_grad()
        loss_fn(model(inputs.to(ctx.device)), targets.to(ctx.device)).backward()
        with torch.no_grad():
            for p in model.parameters():
                p -= lr * p.grad
        if eval_ranks is None or ctx.rank in eval_ranks:
            val_loss = validation_loss(model, ctx.device, share_loss=share_loss)
            if best is None or val_loss < best:
                best = val_loss
            elif anneals:
                lr /= 4.0


def run_loop(ctx: Any) -> None:
    epoch_loop(ctx, eval_ranks=(0,))
