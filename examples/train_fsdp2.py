"""Example target: ``train_split.py``'s classifier and ``Trainer``, ported from DDP to FSDP2.

    ddp-conformance run --target examples/train_fsdp2.py --report-dir out/fsdp2
    ddp-conformance run --target examples/train_fsdp2.py --checks gradient-equivalence,no-sync-equivalence
    ddp-conformance run --target examples/train_fsdp2.py --compare-ddp
    torchrun --nproc-per-node 2 examples/train_fsdp2.py     # the script itself, 2 CPU ranks (gloo)

The port as a team makes it when DDP gives way to ``fully_shard``: ``parallelize`` shards
every block, then the root (the root's own parameters, stem and head, form the last group);
gradient accumulation keeps its one reduction per optimizer step with
``set_requires_gradient_sync(False)`` on all but the last microbatch (FSDP2's ``no_sync``; left
out, every microbatch reduce-scatters: the same result for K times the communication, which
no-sync-equivalence reports as a cost, not a failure — FSDP2 then keeps sharded instead of
unsharded gradients between microbatches, torchtitan's default);
the loss stays the mean over the microbatch divided by K (FSDP2 averages over ranks as DDP did);
clipping goes through ``clip_grad_norm_``, which on FSDP2's DTensor gradients reduces the norm
over every shard; the optimizer is built after ``parallelize``, on the DTensor parameters it
left. The loss, the clip, the checkpoint and the optimizer's construction are where a port
breaks silently: the bug variants in tests/examples/test_fsdp2_examples.py keep DDP's habits
and are caught naming the cause.
``ddp_kwargs`` is what the DDP version used: ``--compare-ddp`` runs that version beside this one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_optimizer_state_dict
from torch.distributed.fsdp import fully_shard
from torch.nn import functional as F

FEATURES, HIDDEN, CLASSES = 12, 32, 3
GRAD_CLIP = 1.0
CHECKPOINT = "fsdp2.pt"

ddp_kwargs = {"find_unused_parameters": False}


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.relu(self.linear(x))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(FEATURES, HIDDEN)
        self.blocks = nn.ModuleList(Block(HIDDEN) for _ in range(2))
        self.head = nn.Linear(HIDDEN, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.stem(x))
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build_model() -> nn.Module:
    return Net()


def parallelize(model: nn.Module, ctx: Any) -> nn.Module:
    """FSDP2 as production applies it: each block its own group, then the root."""
    for block in model.blocks:  # type: ignore[union-attr]
        fully_shard(block, mesh=ctx.mesh)
    fully_shard(model, mesh=ctx.mesh)
    return model


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(batch_size, FEATURES, generator=generator)
    return x, (x[:, :CLASSES] + 0.1 * torch.randn(batch_size, CLASSES, generator=generator)).argmax(dim=1)


def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs, targets)


def build_optimizer(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


class Trainer:
    def __init__(self, model: Any, optimizer: Any) -> None:
        self.model = model
        self.optimizer = optimizer

    def _run_batch(self, microbatches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
        self.optimizer.zero_grad()
        k, total = len(microbatches), 0.0
        for i, (source, targets) in enumerate(microbatches):
            # FSDP2's no_sync: the backward reduce-scatters only on the last microbatch; the
            # others accumulate unsharded gradients locally. The DDP version's flag stays for
            # --compare-ddp, which trains this same step through DDP.
            if hasattr(self.model, "set_requires_gradient_sync"):
                self.model.set_requires_gradient_sync(i == k - 1)
            else:
                self.model.require_backward_grad_sync = i == k - 1
            loss = F.cross_entropy(self.model(source), targets) / k
            loss.backward()
            total += float(loss.detach())
        # On DTensor gradients the norm is reduced over every rank's shard: the global norm.
        nn.utils.clip_grad_norm_(self.model.parameters(), GRAD_CLIP)
        self.optimizer.step()
        return total


def train_step(model: Any, optimizer: Any, microbatches: list[tuple[torch.Tensor, torch.Tensor]],
               loss_fn: Any) -> None:
    """One optimizer step of the trainer over this rank's microbatches."""
    Trainer(model, optimizer)._run_batch(microbatches)


def run_loop(ctx: Any) -> None:
    """The training loop, resuming from ``ctx.checkpoint_dir``: FSDP2's checkpoint is the full
    state dict gathered on every rank (``get_state_dict``, a collective), written by rank 0, and
    loaded on every rank into its own shards (``set_state_dict``)."""
    path = Path(ctx.checkpoint_dir) / CHECKPOINT
    torch.manual_seed(0)
    raw = build_model()
    state = torch.load(path, map_location="cpu", weights_only=True) if path.exists() else None
    if state is not None:
        raw.load_state_dict(state["model"])  # the full weights, before parallelize shards them
    model = ctx.wrap(raw)
    optimizer = build_optimizer(model.parameters())
    step = 0
    if state is not None:
        set_optimizer_state_dict(model, optimizer, state["optimizer"],
                                 options=StateDictOptions(full_state_dict=True))
        step = state["step"]
    trainer = Trainer(model, optimizer)
    while step < ctx.steps:
        # The data of step s, the same whether the loop started at 0 or resumed at s.
        x, y = make_batch(torch.Generator().manual_seed(1000 * ctx.rank + step), 8)
        x, y = x.to(ctx.device), y.to(ctx.device)
        trainer._run_batch([(x[:4], y[:4]), (x[4:], y[4:])])
        step += 1
        if step % ctx.checkpoint_every == 0:
            _save(ctx, path, model, optimizer, step)


def _save(ctx: Any, path: Path, model: Any, optimizer: Any, step: int) -> None:
    # Every rank: gathering the full state dict is a collective over the shards.
    model_state, optim_state = get_state_dict(model, optimizer,
                                              options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if ctx.rank == 0:
        tmp = path.with_suffix(".tmp")
        torch.save({"model": model_state, "optimizer": optim_state, "step": step}, tmp)
        os.replace(tmp, path)
    # No rank goes on (and may be killed, restarted, and read) before the checkpoint is whole.
    dist.barrier()


if __name__ == "__main__":
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    net = parallelize(build_model(), type("Ctx", (), {"mesh": mesh})())
    trainer = Trainer(net, build_optimizer(net.parameters()))
    gen = torch.Generator().manual_seed(dist.get_rank())
    for _ in range(5):
        inputs, labels = make_batch(gen, 8)
        print(f"rank {dist.get_rank()} loss {trainer._run_batch([(inputs[:4], labels[:4]), (inputs[4:], labels[4:])]):.4f}")
    dist.destroy_process_group()
