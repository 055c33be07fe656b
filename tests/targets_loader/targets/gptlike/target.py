"""CORRECT TARGET (loader tests): loss inside forward, no loss_fn, an optimizer built from the
model, a train_step that asks for the step index, sampling with replacement."""

from __future__ import annotations

import torch
from model import TinyLM  # beside this file: the target's folder is importable

sampling = "with-replacement"
steps_seen: list[int] = []


def build_model() -> torch.nn.Module:
    return TinyLM()


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    idx = torch.randint(0, 11, (batch_size, 5), generator=generator)
    return idx, torch.roll(idx, -1, dims=1)


def forward_loss(model, microbatch):  # type: ignore[no-untyped-def]
    inputs, targets = microbatch
    _, loss = model(inputs, targets)
    return loss


def build_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                              {"params": rest, "weight_decay": 0.0}], lr=1e-3)


def train_step(model, optimizer, microbatches, *, step):  # type: ignore[no-untyped-def]
    steps_seen.append(step)
    for inputs, targets in microbatches:
        _, loss = model(inputs, targets)
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
