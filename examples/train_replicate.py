"""Example target: ``train_split.py``'s classifier, ported from DDP to the composable ``replicate``.

    ddp-conformance run --target examples/train_replicate.py --report-dir out/replicate
    ddp-conformance run --target examples/train_replicate.py --checks gradient-equivalence,no-sync-equivalence
    torchrun --nproc-per-node 2 examples/train_replicate.py     # the script itself, 2 CPU ranks (gloo)

DDP's semantics (every rank holds the whole model, gradients averaged over ranks) as the
composable API spells them: PyTorch rebuilt ``replicate`` on FSDP2 (a mesh that replicates
instead of sharding). In torch 2.13 the FSDP2-based one is still private
(``torch.distributed._composable.replicate_with_fsdp``) and the public
``torch.distributed._composable.replicate`` is DDP inside; ``parallelize`` applies the FSDP2-based
one where torch has it, else the public one, and the report's ``wrapper`` says which ran.
The model, the data and the trainer (accumulation through ``set_requires_gradient_sync``,
clipping by ``clip_grad_norm_``) are ``train_fsdp2.py``'s, imported from beside this file.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from train_fsdp2 import Trainer, build_model, build_optimizer, loss_fn, make_batch, train_step

__all__ = ["build_model", "build_optimizer", "loss_fn", "make_batch", "parallelize", "run_loop",
           "train_step"]

ddp_kwargs = {"find_unused_parameters": False}


def parallelize(model: nn.Module, ctx: Any) -> nn.Module:
    """DDP's semantics through the composable API: every block, then the root."""
    try:
        from torch.distributed._composable.replicate_with_fsdp import replicate
    except ImportError:  # torch without the FSDP2-based replicate: the DDP-based one
        from torch.distributed._composable import replicate as ddp_replicate

        return ddp_replicate(model)
    for block in model.blocks:  # type: ignore[union-attr]
        replicate(block, mesh=ctx.mesh)
    replicate(model, mesh=ctx.mesh)
    return model


def run_loop(ctx: Any) -> None:
    torch.manual_seed(0)
    model = ctx.wrap(build_model())
    trainer = Trainer(model, build_optimizer(model.parameters()))
    generator = torch.Generator().manual_seed(100 + ctx.rank)
    for _ in range(ctx.steps):
        x, y = make_batch(generator, 8)
        x, y = x.to(ctx.device), y.to(ctx.device)
        trainer._run_batch([(x[:4], y[:4]), (x[4:], y[4:])])


if __name__ == "__main__":
    import torch.distributed as dist
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
