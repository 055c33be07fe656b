"""Example target: a small mixture-of-experts classifier with top-k gating, in plain PyTorch,
wrapped for the suite.

    ddp-conformance run --target examples/train_moe.py --report-dir out/moe
    ddp-conformance run --target examples/train_moe.py --checks gradient-equivalence,no-sync-equivalence

A Transformer block (self-attention, then the MoE layer as its feed-forward) and a per-token
classifier. The MoE layer has the pattern of the widely copied sparsely-gated MoE layers
(Shazeer et al. 2017), without noisy gating: a gate ``w_gate`` initialised to zeros, softmax over its logits, the top ``K`` experts
per token (``torch.topk``) with their probabilities renormalised, each expert an MLP run on the
tokens routed to it and the outputs summed back with ``index_add_``. An expert that no token of
a rank chose gets no gradient on that rank, so DDP needs ``find_unused_parameters=True`` (as MoE
trainers set it). Adam, a mean cross-entropy per token, gradient accumulation with ``no_sync``.

Top-k routing is discontinuous: a token whose K-th and (K+1)-th gate probabilities are within a
last bit of each other goes to another expert when the sums are done in another order — as
they are under DDP (each rank's shard) and in one process (the whole batch). From such a flip
the two runs legitimately part, by far more than rounding: the suite records the routing of
both runs and says so (inconclusive, with where the routing first differed) instead of failing.
Expert-choice models are compared exactly while their routing agrees.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

FEATURES, CLASSES, SEQ = 16, 5, 8
EXPERTS, K, HIDDEN, HEADS = 4, 2, 32, 2
LR = 1e-3

ddp_kwargs = {"find_unused_parameters": True}  # experts a rank's tokens did not choose
global_batch_size = 16  # 128 tokens per step


class Expert(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(FEATURES, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, FEATURES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.relu(self.fc1(x)))


class TopKMoE(nn.Module):
    """Each token to its K most probable experts; outputs summed with the renormalised gates."""

    def __init__(self, k: int = K) -> None:
        super().__init__()
        self.k = k
        self.w_gate = nn.Parameter(torch.zeros(FEATURES, EXPERTS))
        self.experts = nn.ModuleList(Expert() for _ in range(EXPERTS))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = x.reshape(-1, FEATURES)
        probs = F.softmax(tokens @ self.w_gate, dim=-1)
        top, chosen = probs.topk(self.k, dim=-1)  # the routing decision
        gates = top / top.sum(dim=-1, keepdim=True)
        out = torch.zeros_like(tokens)
        for e, expert in enumerate(self.experts):
            rows, slot = (chosen == e).nonzero(as_tuple=True)
            if rows.numel():
                out = out.index_add(0, rows, expert(tokens[rows]) * gates[rows, slot].unsqueeze(1))
        return out.reshape(x.shape)


class MoEClassifier(nn.Module):
    """One Transformer block whose feed-forward is the MoE layer, then a per-token classifier."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(FEATURES, FEATURES)
        self.attn = nn.MultiheadAttention(FEATURES, HEADS, batch_first=True)
        self.norm1 = nn.LayerNorm(FEATURES)
        self.norm2 = nn.LayerNorm(FEATURES)
        self.moe = TopKMoE()
        self.head = nn.Linear(FEATURES, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.inp(x)
        a = self.norm1(h)
        h = h + self.attn(a, a, a, need_weights=False)[0]
        h = h + self.moe(self.norm2(h))
        return self.head(h)


def build_model() -> nn.Module:
    return MoEClassifier()


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(batch_size, SEQ, FEATURES, generator=generator)
    y = (x[..., :CLASSES] + 0.5 * torch.randn(batch_size, SEQ, CLASSES, generator=generator)).argmax(-1)
    return x, y


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, CLASSES), targets.reshape(-1))


def build_optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.Adam(params, lr=LR)


def train_step(model: Any, optimizer: Any, microbatches: list[tuple[torch.Tensor, torch.Tensor]],
               loss_fn: Any) -> None:
    optimizer.zero_grad()
    for i, (x, y) in enumerate(microbatches):
        last = i == len(microbatches) - 1
        model.require_backward_grad_sync = last  # accumulate locally, synchronise on the last
        (loss_fn(model(x), y) / len(microbatches)).backward()
    optimizer.step()
