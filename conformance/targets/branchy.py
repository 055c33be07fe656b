"""Built-in target ``branchy``: an MLP with a conditional auxiliary head (the seeds' incident).

    ddp-conformance run --target branchy
    ddp-conformance run --target conformance/targets/branchy.py --checks unused-parameters

The auxiliary head runs only when the *local* batch holds a sample that asks for it
(:func:`needs_aux`): a data-dependent branch, shipped with ``find_unused_parameters=False``
like the incident's job. ``make_batch`` marks every ``AUX_EVERY``-th sample of the global
batch, and the conformance checks split it into contiguous microbatches of 4 samples, so
every rank takes the branch at every step and those checks pass. The ``unused-parameters``
chaos check builds per-rank batches where some ranks do not take it (:func:`make_rows`),
leaving the ``aux_head.*`` parameters without a gradient there.
"""

from __future__ import annotations

import torch
from torch import nn

IN, HIDDEN, OUT = 12, 32, 3
FLAG_COLUMN = 0  # inputs[:, FLAG_COLUMN] > 0 marks a sample that needs the auxiliary head
AUX_EVERY = 4
AUX_WEIGHT = 0.5
AUX_PARAMETER_PREFIX = "aux_head."

ddp_kwargs = {"find_unused_parameters": False}


def needs_aux(inputs: torch.Tensor) -> bool:
    """Whether a (local) batch takes the auxiliary branch. Pure: no state, no randomness."""
    return bool((inputs[:, FLAG_COLUMN] > 0).any())


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, HIDDEN), nn.Tanh())
        self.head = nn.Linear(HIDDEN, OUT)
        self.aux_head = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, OUT))

    def forward(self, inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        hidden = self.trunk(inputs)
        mask = (inputs[:, FLAG_COLUMN] > 0).to(hidden.dtype)
        # The data-dependent branch: when no local sample asks for it, aux_head's parameters
        # get no gradient on this rank in this step.
        aux = self.aux_head(hidden) if needs_aux(inputs) else None
        return self.head(hidden), aux, mask


def make_rows(generator: torch.Generator, batch_size: int, *, aux: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows with an explicit per-sample aux flag (bool tensor of length batch_size)."""
    inputs = torch.randn(batch_size, IN, generator=generator)
    inputs[:, FLAG_COLUMN] = torch.where(aux, 1.0, -1.0)
    targets = torch.randn(batch_size, OUT, generator=generator)
    return inputs, targets


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    aux = torch.arange(batch_size) % AUX_EVERY == 0
    return make_rows(generator, batch_size, aux=aux)


def loss_fn(outputs: tuple[torch.Tensor, torch.Tensor | None, torch.Tensor],
            targets: torch.Tensor) -> torch.Tensor:
    main, aux, mask = outputs
    loss = nn.functional.mse_loss(main, targets)
    if aux is not None:
        # A sum over flagged samples divided by the batch size: still a mean over samples,
        # so the gradient stays additive across ranks and microbatches.
        per_sample = ((aux - targets) ** 2).mean(dim=1)
        loss = loss + AUX_WEIGHT * (per_sample * mask).sum() / targets.shape[0]
    return loss


def build_model() -> nn.Module:
    return Branchy()
