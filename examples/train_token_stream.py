"""Example target: a token-stream LM trainer in the shape of llm.c's PyTorch reference trainer
(``train_gpt2.py``): shards read **in order** by a hand-written ``DistributedDataLoader``, and
a sharded optimizer, ``ZeroRedundancyOptimizer`` over AdamW (``zero_stage=1``).

    ddp-conformance run --target examples/train_token_stream.py --report-dir out/stream
    ddp-conformance run --target examples/train_token_stream.py --checks sampler-coverage,rank-consistency
    torchrun --standalone --nproc-per-node 2 -m conformance run --attach --target examples/train_token_stream.py

What it shows:

- **Sequential data is a choice.** The loader starts rank r at window r·B and advances by
  B·N windows: every epoch reads the stream in the same order, by design. ``epoch_batches``
  yields each batch's window indices (``sample_identity = "index"``), so sampler-coverage can
  read the order: ascending on every rank, it passes with "sequential order, no shuffling"
  (a *shuffled* order that repeats every epoch is the forgotten ``set_epoch`` and fails).
- **A sharded optimizer.** ``ZeroRedundancyOptimizer.step()`` updates this rank's shard of
  the parameters with its local AdamW, then broadcasts every shard: in the middle of that
  step the ranks differ by design. rank-consistency's look at ``run_loop`` is taken where
  the user's ``optimizer.step()`` returns, where the ranks must agree bit for bit.
- **Script globals as module state.** The script keeps ``args``, the learning rate and the
  DDP flag in globals set by ``main()``; here they are module-level constants (``ARGS``) read
  by the functions the suite calls, and anything built per process (the token stream) is built
  at import, as ``main()`` would build it, identically on every rank.
- **The loss inside forward** (``forward(idx, targets) -> (logits, loss)``, through
  ``forward_loss``), accumulation through ``require_backward_grad_sync``, clipping.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn import functional as F


@dataclass(frozen=True)
class Args:
    """The script's argparse namespace, frozen into module state."""

    vocab_size: int = 64
    n_embd: int = 32
    batch_size: int = 4  # B: rows per micro-batch
    sequence_length: int = 8  # T
    learning_rate: float = 3e-3
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    zero_stage: int = 1
    stream_windows: int = 48  # windows of T tokens in the token stream


ARGS = Args()
# The token stream, built at import as main() builds it: the same on every rank.
TOKENS = torch.randint(ARGS.vocab_size, (ARGS.stream_windows * ARGS.sequence_length + 1,),
                       generator=torch.Generator().manual_seed(1337))

sample_identity = "index"
ddp_kwargs = {"find_unused_parameters": False}


class DistributedDataLoader:
    """llm.c's loader: rank r starts at window r·B, each batch advances B·N windows."""

    def __init__(self, tokens: torch.Tensor, B: int, T: int, process_rank: int, num_processes: int) -> None:
        self.tokens, self.B, self.T = tokens, B, T
        self.process_rank, self.num_processes = process_rank, num_processes
        self.reset()

    def reset(self) -> None:
        self.current_position = self.B * self.T * self.process_rank

    def batches_per_epoch(self) -> int:
        return (len(self.tokens) - 1) // (self.B * self.T * self.num_processes)

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor, int]:
        B, T = self.B, self.T
        start = self.current_position
        buf = self.tokens[start:start + B * T + 1]
        self.current_position += B * T * self.num_processes
        # Start over when this rank's own next batch no longer fits. (Testing the whole step's
        # stride, B·T·N, instead makes rank 1 reset one batch early and re-read its first
        # batch in the same epoch: sampler-coverage names that wrap.)
        if self.current_position + B * T + 1 > len(self.tokens):
            self.reset()  # the next epoch reads the stream from the start again
        return buf[:-1].view(B, T), buf[1:].view(B, T), start // T


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.wte = nn.Embedding(ARGS.vocab_size, ARGS.n_embd)
        self.mlp = nn.Sequential(nn.Linear(ARGS.n_embd, 4 * ARGS.n_embd), nn.GELU(),
                                 nn.Linear(4 * ARGS.n_embd, ARGS.n_embd))
        self.ln_f = nn.LayerNorm(ARGS.n_embd)
        self.lm_head = nn.Linear(ARGS.n_embd, ARGS.vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight  # tied, as in GPT-2

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None) -> tuple[torch.Tensor, Any]:
        x = self.wte(idx)
        x = x + self.mlp(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def build_model() -> nn.Module:
    return TinyLM()


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A global batch of windows of the stream (drawn from ``generator``, as the suite asks)."""
    T = ARGS.sequence_length
    starts = torch.randint(ARGS.stream_windows, (batch_size,), generator=generator) * T
    x = torch.stack([TOKENS[s:s + T] for s in starts.tolist()])
    y = torch.stack([TOKENS[s + 1:s + 1 + T] for s in starts.tolist()])
    return x, y


def forward_loss(model: Any, microbatch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    _, loss = model(*microbatch)
    return loss


def build_optimizer(model: nn.Module) -> Any:
    """llm.c's configure_optimizers: decay on matrices only; zero_stage=1 shards AdamW's state."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": ARGS.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    if ARGS.zero_stage == 1:
        optimizer = ZeroRedundancyOptimizer(decay, optimizer_class=torch.optim.AdamW,
                                            lr=ARGS.learning_rate, betas=(0.9, 0.95), foreach=True,
                                            weight_decay=ARGS.weight_decay)
        optimizer.add_param_group(groups[1])
        return optimizer
    return torch.optim.AdamW(groups, lr=ARGS.learning_rate, betas=(0.9, 0.95), foreach=True)


def get_lr(step: int) -> float:
    return ARGS.learning_rate * 0.5 * (1.0 + math.cos(math.pi * min(step, 100) / 100))


def train_step(model: Any, optimizer: Any, microbatches: list[tuple[torch.Tensor, torch.Tensor]],
               *, step: int) -> None:
    optimizer.zero_grad(set_to_none=True)
    k = len(microbatches)
    for micro_step, microbatch in enumerate(microbatches):
        # Only the last micro-step's backward all-reduces (llm.c and nanoGPT toggle the flag).
        model.require_backward_grad_sync = micro_step == k - 1
        loss = forward_loss(model, microbatch) / k
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), ARGS.grad_clip)
    for group in optimizer.param_groups:
        group["lr"] = get_lr(step)
    optimizer.step()


def epoch_batches(rank: int, world_size: int, epoch: int) -> Iterator[list[int]]:
    """One epoch of this rank's loader: each batch's window indices, in the order it reads them."""
    loader = DistributedDataLoader(TOKENS, ARGS.batch_size, ARGS.sequence_length, rank, world_size)
    for _ in range(loader.batches_per_epoch()):
        *_, first = loader.next_batch()
        yield list(range(first, first + ARGS.batch_size))


def run_loop(ctx: Any) -> None:
    """A few steps of the training loop, through ``ctx.wrap`` (the suite's instrumented DDP)."""
    torch.manual_seed(0)
    model = ctx.wrap(build_model())
    optimizer = build_optimizer(model.module)
    loader = DistributedDataLoader(TOKENS, ARGS.batch_size, ARGS.sequence_length, ctx.rank, ctx.world_size)
    for step in range(ctx.steps):
        x, y, _ = loader.next_batch()
        train_step(model, optimizer, [(x.to(ctx.device), y.to(ctx.device))], step=step)
