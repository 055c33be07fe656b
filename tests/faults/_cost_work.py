"""World work functions of the unused-parameters cost tests: what a sequence of the check's
rank-side calls built, ran and broadcast on a rank."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def counted(ctx: Any, spec: str, calls: list[tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]]) \
        -> dict[str, Any]:
    """Run the check's rank functions ``calls`` (function, args, kwargs) one after another on
    this rank; the target's builds and forwards (its ``COUNTS``), DDP's initial broadcasts of
    the whole module, each call's result, and the models still kept."""
    import torch.nn.parallel.distributed as distributed

    from conformance.harness.targets import load_target
    from ddp_conformance.faults.checks import _kept_model

    counts = load_target(spec).module.COUNTS
    counts.update(builds=0, forwards=0)
    synced = []
    original = distributed._sync_module_states

    def sync(*args: Any, **kwargs: Any) -> Any:
        synced.append(1)
        return original(*args, **kwargs)

    distributed._sync_module_states = sync
    try:
        values = [fn(ctx, *args, **kwargs) for fn, args, kwargs in calls]
    finally:
        distributed._sync_module_states = original
    return {**counts, "broadcasts": len(synced), "values": values, "kept_after": len(_kept_model._SLOT)}
