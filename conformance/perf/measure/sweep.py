"""The all-reduce sweep that runs on every rank: exact results checked, times measured.

The timed, checked all-reduce itself (``sweep_on``) lives in ``conformance/harness/collective_timing.py``,
shared with the node-health check's links; here are the world work functions over it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ...harness.collective_timing import ITERS, WARMUP, sweep_on

if TYPE_CHECKING:
    from ...harness.world import RankContext

CPU_SIZES = tuple(4096 << k for k in range(13))  # 4 KB .. 16 MB: the whole check stays seconds
GPU_SIZES = tuple(4096 << k for k in range(17))  # 4 KB .. 256 MB, as nccl-tests' default range


def default_sizes(backend: str) -> tuple[int, ...]:
    return GPU_SIZES if backend == "nccl" else CPU_SIZES


def node_key() -> str:
    """Which node this rank is on: torchrun's GROUP_RANK, Slurm's node id, else the hostname."""
    import socket

    for var in ("GROUP_RANK", "SLURM_NODEID"):
        if var in os.environ:
            return f"node{os.environ[var]}"
    return socket.gethostname()


def allreduce_sweep(ctx: RankContext, sizes: Sequence[int], *, warmup: int = WARMUP, iters: int = ITERS,
                    corrupt_rank: int | None = None) -> dict[str, Any]:
    """World work function: the sweep on the whole world, plus where this rank runs."""
    out: dict[str, Any] = dict(sweep_on(ctx.group, ctx.rank, ctx.world_size, ctx.device, sizes, warmup=warmup,
                                        iters=iters, corrupt=ctx.rank == corrupt_rank))
    out.update(hostname=ctx.hostname, node=node_key(), local_rank=int(os.environ.get("LOCAL_RANK", ctx.local_rank)))
    return out


def split_sweep(ctx: RankContext, sizes: Sequence[int], *, nodes: Sequence[str] | None = None,
                warmup: int = WARMUP, iters: int = ITERS) -> dict[str, Any] | None:
    """World work function: intra-node and inter-node sweeps, when the world has both kinds of link.

    ``nodes`` (one key per rank) overrides the detected node of each rank, for tests. Returns
    None on every rank when there is nothing to separate (one node, or one rank per node).
    """
    import torch.distributed as dist

    if nodes is None:
        nodes = [None] * ctx.world_size  # type: ignore[list-item]
        # Every rank needs every rank's node to build the same groups in the same order.
        dist.all_gather_object(nodes, node_key(), group=ctx.side_group)
    by_node: dict[str, list[int]] = {}
    for rank, key in enumerate(nodes):
        by_node.setdefault(key, []).append(rank)
    if len(by_node) < 2 or all(len(r) == 1 for r in by_node.values()):
        return None
    # new_group is itself collective: every rank creates every group, members or not.
    intra = {key: dist.new_group(ranks) for key, ranks in sorted(by_node.items())}
    leaders = sorted(ranks[0] for ranks in by_node.values())
    inter = dist.new_group(leaders)
    me = nodes[ctx.rank]
    result: dict[str, Any] = {"node": me, "intra": None, "inter": None}
    mine = by_node[me]
    if len(mine) > 1:
        result["intra"] = sweep_on(intra[me], mine.index(ctx.rank), len(mine), ctx.device, sizes,
                                   warmup=warmup, iters=iters)
    # Intra-node traffic must be over before the inter-node sweep, or the two share links.
    dist.barrier(group=ctx.side_group)
    if ctx.rank in leaders:
        result["inter"] = sweep_on(inter, leaders.index(ctx.rank), len(leaders), ctx.device, sizes,
                                   warmup=warmup, iters=iters)
    result["group_sizes"] = {"intra": len(mine), "inter": len(leaders)}
    return result
