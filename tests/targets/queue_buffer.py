"""Correct target: a contrastive model that keeps a queue of past features in a buffer and
writes each batch into it at a pointer, as MoCo does (``_dequeue_and_enqueue``: the queue's
length a multiple of every batch size, ``queue[:, ptr:ptr + b] = keys.T``). Its forward changes
its own state, so every forward the suite runs *before* training (its probes) must leave that
state as it found it: a probe on 4 samples moved the pointer by 4, and the reference's
16-sample write then ran off the queue's end ("The expanded size of the tensor (12) must match
the existing size (16)"), blamed on DDP.

    ddp-conformance run --target tests/targets/queue_buffer.py --checks gradient-equivalence
"""

from __future__ import annotations

import torch
from torch import nn

QUEUE, DIM = 16, 8


class QueueNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(DIM, DIM), nn.BatchNorm1d(DIM), nn.ReLU(), nn.Linear(DIM, DIM))
        self.register_buffer("queue", torch.zeros(DIM, QUEUE))
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q = self.encoder(x)
        # The queue is written, not read here: what MoCo's logits read from it depends on the
        # batches each rank gathered, which is not what this target is about.
        with torch.no_grad():
            ptr, b = int(self.queue_ptr), q.shape[0]
            self.queue[:, ptr:ptr + b] = q.detach().T  # fails unless ptr + b stays within QUEUE
            self.queue_ptr[0] = (ptr + b) % QUEUE
        return q


def build_model() -> nn.Module:
    return QueueNet()


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    return (torch.randn(batch_size, DIM, generator=generator),
            torch.randn(batch_size, DIM, generator=generator))


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.mse_loss(output, target)


global_batch_size = 16
