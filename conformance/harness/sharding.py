"""The data contract: one seeded *global* batch, and rank r's contiguous share of it.

``make_batch(generator, B)`` (README, "Writing a target") makes one global batch; rank r takes
the contiguous rows ``[r·B/N, (r+1)·B/N)``, split into K contiguous microbatches. At world size
1 with K = N·K' that yields exactly the N-rank run's microbatches in rank order, which is what
makes a single-process reference comparable. Every rank and the reference draw the very same
samples from the same seed without communicating. Functions here run inside rank processes and
import torch lazily, as ``harness.ddp`` does.
"""

from __future__ import annotations

from typing import Any

from .batches import move, part_dims, rows, take_rows


def global_batch(target: Any, batch_size: int, *, seed: int) -> tuple[Any, Any]:
    """The global batch drawn with a generator seeded ``seed``: every rank and the reference
    draw the very same samples without communicating. A loaded target's output is validated
    at the edge (a TargetError names the mistake)."""
    import torch

    from .targets.loading import make_batch_checked
    from .targets.target import Target

    generator = torch.Generator().manual_seed(seed)
    if isinstance(target, Target):
        return make_batch_checked(target, generator, batch_size)
    inputs, targets = target.make_batch(generator, batch_size)
    return inputs, targets


def batch_dims(target: Any) -> Any:
    """The target's declared batch dimensions (``batch_dim``; None: dim 0 everywhere)."""
    return getattr(target, "batch_dim", None)


def shard(batch: tuple[Any, Any], rank: int, world_size: int,
          microbatches: int = 1, *, dims: Any = None) -> list[tuple[Any, Any]]:
    """Rank r's contiguous samples [r·B/N, (r+1)·B/N), split into K contiguous microbatches
    (every tensor of inputs and targets sliced alike along its batch dimension: dim 0, or what
    ``dims``, the target's ``batch_dim``, declares: ``harness.batches``)."""
    inputs, targets = batch
    in_dims, out_dims = part_dims(dims, 0), part_dims(dims, 1)
    size = rows(inputs, in_dims) or rows(targets, out_dims)
    if size % (world_size * microbatches):
        raise ValueError(f"global batch {size} is not divisible by world_size={world_size} x "
                         f"microbatches={microbatches}")
    per_rank = size // world_size
    per_micro = per_rank // microbatches
    start = rank * per_rank
    return [(take_rows(inputs, start + i * per_micro, start + (i + 1) * per_micro, in_dims),
             take_rows(targets, start + i * per_micro, start + (i + 1) * per_micro, out_dims))
            for i in range(microbatches)]


def to_device(batches: list[tuple[Any, Any]], device: Any) -> list[tuple[Any, Any]]:
    return [(move(x, device), move(y, device)) for x, y in batches]


def rank_batch(target: Any, rank: int, world_size: int, *, seed: int, per_rank: int = 4,
               batch_size: int | None = None, device: Any = None) -> tuple[Any, Any]:
    """This rank's contiguous chunk of a seeded global batch of ``batch_size`` rows
    (default ``per_rank`` rows per rank), on ``device`` when given."""
    batch = global_batch(target, batch_size or per_rank * world_size, seed=seed)
    (inputs, targets), = shard(batch, rank, world_size, dims=batch_dims(target))
    if device is not None:
        inputs, targets = move(inputs, device), move(targets, device)
    return inputs, targets
