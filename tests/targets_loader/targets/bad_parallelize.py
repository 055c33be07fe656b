"""BAD TARGET: parallelize shards the model but forgets to return it (returns None)."""

from __future__ import annotations

from torch.distributed.fsdp import fully_shard

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401


def parallelize(model, ctx):  # type: ignore[no-untyped-def]  # line 10: returns nothing
    fully_shard(model, mesh=ctx.mesh)
