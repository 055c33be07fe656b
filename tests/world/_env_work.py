"""Work functions for tests/world/test_rank_environment.py: what the user's code can ask a rank
about its world (module-level: pickled by reference)."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any


def what_the_rank_sees(ctx: Any) -> dict[str, Any]:
    """The rank's environment, and the world as torch.distributed reports it."""
    import torch.distributed as dist

    return {"env": dict(os.environ), "rank": dist.get_rank(), "world_size": dist.get_world_size(),
            "ctx_rank": ctx.rank}


def rendezvous_from_env(ctx: Any) -> tuple[int, int, list[str]]:
    """torch's own ``env://`` rendezvous, as user code that builds a store or a second process
    group does: every rank writes a key through it and reads every rank's."""
    import torch.distributed as dist

    store, rank, world_size = next(dist.rendezvous("env://", timeout=timedelta(seconds=30)))
    store.set(f"user/{rank}", str(os.getpid()))
    store.wait([f"user/{r}" for r in range(world_size)], timedelta(seconds=30))
    return rank, world_size, [store.get(f"user/{r}").decode() for r in range(world_size)]
