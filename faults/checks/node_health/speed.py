"""Per-rank throughput and pairwise links: the rank that runs slow, the pair that links slow.

Rank side (:func:`timed_steps`, :func:`pair_links`, called by ``rank.node_rank``):

- **throughput**: each repeat of the compute comparison is timed on every rank, forward and
  backward of the plain module, the gathers left out (``rank.node_rank``; every repeat starts
  right after the previous one's gather, so the ranks are timed on the same host moments); a
  "step" site at "forward" is offered to the fault first (a :class:`~faults.injectors.SlowRank`
  slows it). :func:`timed_steps` times bare steps the same way (the benchmark's unit);
- **links**: each pair of ring neighbours all-reduces on its own 2-rank group, one pair at a
  time, with the harness's checked, timed all-reduce (``conformance/harness/collective_timing.py``,
  the allreduce-bandwidth check's): a 2-rank all-reduce moves the message over that one link,
  and every result is checked exactly.

Judge side (:func:`judge_speed`): a rank slower than the median of the others in every timed
step, by :data:`SLOW_RATIO` or more, is named with its ratio; slower by that ratio but not in
every step is the host's noise (inconclusive, never failed: ``straggler.step_differences``).
A pair whose best iteration is below :data:`LINK_FACTOR` of the other pairs' median bandwidth
is named; a wrong all-reduce result on a link is corruption on it.
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Any

from ..._log import InjectionLog
from ...sites import Fault, Site
from ..straggler import spread, step_differences

if TYPE_CHECKING:
    from conformance.harness.world import RankContext

#: Bare steps timed by :func:`timed_steps` (the cost unit of docs/node-health.md, "The numbers").
TIMED_STEPS = 3
#: A rank this much slower than the others' median, in every repeat, is named (a rank per device).
SLOW_RATIO = 1.25
#: The same on CPU ranks, which share the host's cores with each other and with whatever else runs
#: there: the scheduler alone makes one of 3 ranks on 2 busy cores ~2x slower in every step
#: (measured here, tied-lm), so only a rank several times slower is the rank's own doing.
SHARED_SLOW_RATIO = 5.0
#: A link whose best iteration reaches less than this share of the median of the other pairs of
#: its kind (within a host, or across hosts) is named (GPU ranks: their own links).
LINK_FACTOR = 0.5
#: The same for CPU ranks, whose "links" are all the host's loopback: a busy host alone puts one
#: pair at ~0.3 of the others in 1 of 6 measurements here, so only a pair 10x slower is named.
SHARED_LINK_FACTOR = 0.1
LINK_SIZES = (1 << 20, 4 << 20)  # 1 and 4 MiB: past the latency-bound sizes on loopback and NVLink


def timed_steps(ctx: RankContext, target: Any, model: Any, inputs: Any, targets: Any, fault: Fault,
                log: InjectionLog, *, steps: int = TIMED_STEPS) -> list[float]:
    """Seconds of each of ``steps`` forward/backward passes on this rank."""
    import torch.distributed as dist

    from conformance.harness.ddp import sync_device

    times = []
    for i in range(steps):
        # Every rank starts step i together: the ranks are timed on the same host moments.
        dist.barrier(group=ctx.side_group)
        t0 = time.perf_counter()
        fault.inject(Site("step", ctx.rank, i, "forward", log, device=ctx.device))
        model.zero_grad(set_to_none=True)
        target.compute_loss(model, inputs, targets).backward()
        sync_device(ctx.device)
        times.append(time.perf_counter() - t0)
    return times


def _pairs(world_size: int) -> list[tuple[int, int]]:
    """Ring neighbours: (r, r+1) for every r, each pair once (one pair for 2 ranks)."""
    pairs = {tuple(sorted((r, (r + 1) % world_size))) for r in range(world_size)}
    return sorted((a, b) for a, b in pairs if a != b)


def pair_links(ctx: RankContext, *, sizes: tuple[int, ...] = LINK_SIZES, iters: int = 5, private: bool = False,
               fault: Fault | None = None, log: InjectionLog | None = None) -> list[dict[str, Any]]:
    """Per ring-neighbour pair this rank belongs to: sizes, per-iteration times, wrong results.

    ``private``: the world runs in a private network (``World(private_network=True)``); each
    rank's end of its pairs then gets an address of its own there (``pairs``), and rank 0
    offers ``fault`` a "link" site that can shape one pair (a :class:`~faults.injectors.SlowPair`)
    before the pairs are measured, and unshapes it after."""
    import torch.distributed as dist

    from conformance.harness.collective_timing import sweep_on

    from .pairs import PairShaper, new_pair_groups

    pairs = _pairs(ctx.world_size)
    key = f"node-health/pairs/{ctx.world_size}/{'private' if private else 'loopback'}"
    groups = ctx.cache.get(key)
    if groups is None:
        # new_group is itself collective: every rank creates every pair's group, in one order.
        groups = ctx.cache[key] = (new_pair_groups(ctx, pairs) if private
                                   else [dist.new_group(list(p)) for p in pairs])
    shaper = PairShaper(pairs) if private and ctx.rank == 0 else None
    if shaper is not None and fault is not None:
        fault.inject(Site("link", ctx.rank, 0, "data", log if log is not None else InjectionLog(), link=shaper))
    # Every pair is measured after the shaping (or its absence) is in place.
    dist.barrier(group=ctx.side_group)
    out = []
    try:
        for pair, group in zip(pairs, groups):
            if ctx.rank in pair:
                swept = sweep_on(group, pair.index(ctx.rank), 2, ctx.device, list(sizes), warmup=1, iters=iters)
                out.append({"pair": list(pair), "sizes": list(sizes), **swept})
            # One pair at a time: two pairs at once would share a rank's link and each other's cores.
            dist.barrier(group=ctx.side_group)
    finally:
        if shaper is not None:
            shaper.close()
    return out


def judge_speed(timing: dict[int, list[float]], links: list[dict[str, Any]], *, threshold: float = SLOW_RATIO,
                link_factor: float = LINK_FACTOR, hosts: dict[int, str] | None = None) -> dict[str, Any]:
    """Named slow ranks and links, the noise, and what is inconclusive (plain data for the judge):
    a rank is slow at ``threshold`` times the others' median step or more; a link below
    ``link_factor`` of the median of the other pairs of its kind (``hosts``: each rank's host; a
    pair within a host is compared with pairs within a host, across hosts with across)."""
    medians = {r: statistics.median(t) for r, t in timing.items() if t}
    out: dict[str, Any] = {"per_rank_s": {r: round(m, 6) for r, m in medians.items()}, "slow": [],
                           "noisy": [], "links": [], "slow_links": [], "wrong_links": [], "threshold": threshold,
                           "link_factor": link_factor}
    if len(medians) >= 2:
        for rank, mine in medians.items():
            others = statistics.median(m for r, m in medians.items() if r != rank)
            ratio = mine / others if others > 0 else 1.0
            if ratio < threshold:
                continue
            diffs = step_differences(timing, rank)
            entry = {"rank": rank, "ratio": round(ratio, 3), "noise_s": round(spread(diffs), 6)}
            (out["slow"] if diffs and min(diffs) > 0 else out["noisy"]).append(entry)
    by_pair: dict[tuple[int, int], dict[str, Any]] = {}
    for link in links:
        pair = (int(link["pair"][0]), int(link["pair"][1]))
        size = link["sizes"][-1]
        times = link["times"][-1]
        best, median = size / min(times) / 1e9, size / statistics.median(times) / 1e9
        wrong = int(sum(link["wrong"]))
        seen = by_pair.get(pair)
        if seen is None:
            by_pair[pair] = {"pair": list(pair), "bytes": size, "best_gbps": best, "median_gbps": median,
                             "wrong": wrong}
            continue
        # The slower end's view is the link's (both ends wait for the same bytes).
        seen.update(best_gbps=min(seen["best_gbps"], best), median_gbps=min(seen["median_gbps"], median),
                    wrong=seen["wrong"] + wrong)
    out["links"] = list(by_pair.values())

    def kind(entry: dict[str, Any]) -> str:
        a, b = entry["pair"]
        return "within a host" if (hosts or {}).get(a) == (hosts or {}).get(b) else "across hosts"

    for entry in out["links"]:
        entry["kind"] = kind(entry)
    for entry in out["links"]:
        if entry["wrong"]:
            out["wrong_links"].append(entry)
        peers = [e["median_gbps"] for e in out["links"] if e is not entry and e["kind"] == entry["kind"]]
        if len(peers) >= 2 and entry["best_gbps"] < link_factor * statistics.median(peers):
            out["slow_links"].append({**entry, "ratio": round(entry["best_gbps"] / statistics.median(peers), 3)})
    return out
