"""World work function of the bucket-sweep tests: DDP's own rebuilt layout for each cap."""

from __future__ import annotations

import gc
from typing import Any


def ddp_layouts(ctx: Any, spec: str, caps: list[float]) -> list[str]:
    """The target wrapped with each cap in turn, three steps each (DDP logs its rebuilt layout at
    the third forward); each cap's per-bucket parameter indices, as DDP logged them."""
    import torch

    from conformance.harness.ddp import PROBE_SEED, bucket_layout, wrap
    from conformance.harness.sharding import rank_batch
    from conformance.harness.targets import load_target

    target = load_target(spec)
    torch.manual_seed(PROBE_SEED)
    module = target.build_model()
    out = []
    for cap in caps:
        model = wrap(module, ctx.device, {**target.ddp_kwargs, "bucket_cap_mb": cap}, target=target)
        optimizer = target.make_optimizer(model)
        for step in range(3):
            batch = rank_batch(target, ctx.rank, ctx.world_size, seed=step, device=ctx.device)
            target.run_step(model, optimizer, [batch], step=step)
        out.append(bucket_layout(model))
        module.zero_grad(set_to_none=True)
        del model, optimizer
        gc.collect()
    return out


def counting_init_syncs(ctx: Any, seed_per_rank: bool, fn: Any, *args: Any) -> tuple[int, Any]:
    """``fn(ctx, *args)`` and how many times DDP's construction broadcast the module to the
    ranks (``init_sync``) on this rank meanwhile. ``seed_per_rank``: ``torch.manual_seed``
    seeds each rank apart, so a model built after it differs across ranks."""
    import torch
    from torch.nn.parallel import distributed

    real_sync, real_seed = distributed._sync_module_states, torch.manual_seed
    calls: list[int] = []

    def sync(*a: Any, **k: Any) -> Any:
        calls.append(1)
        return real_sync(*a, **k)

    distributed._sync_module_states = sync
    if seed_per_rank:
        torch.manual_seed = lambda seed: real_seed(seed + 1000 * ctx.rank)  # type: ignore[assignment]
    try:
        value = fn(ctx, *args)
    finally:
        distributed._sync_module_states, torch.manual_seed = real_sync, real_seed
    return len(calls), value
