"""Recommendations: each failed, inconclusive or warning check mapped to concrete advice.

The advice is the production checklist of docs/ddp-background.md, specialised with what the check
measured (the best bucket size it found, the cost of ``find_unused_parameters`` it timed, the
culprit rank it named). A check that knows better sets its record's ``recommendation``; that
always wins. Otherwise the rule for the check id supplies one, refined by evidence keys.

A *warning* is a passed check that still has something to say: a non-empty ``warnings``
list in its metrics or evidence (e.g. ``find_unused_parameters=True`` that is not needed,
a configured bucket size slower than the best one found).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, is_dataclass
from typing import Any

Rule = Callable[[Mapping[str, Any], Mapping[str, Any]], str]


def as_dict(record: Any) -> dict[str, Any]:
    """A record as a plain dict, whether a CheckRecord or already JSON."""
    if isinstance(record, Mapping):
        return dict(record)
    if is_dataclass(record) and not isinstance(record, type):
        return asdict(record)
    return {}


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _has(data: Mapping[str, Any], *keys: str) -> bool:
    return any(data.get(k) not in (None, False, [], {}, "", 0) for k in keys)


def _names(value: Any, limit: int = 5) -> str:
    if isinstance(value, (list, tuple)) and value:
        shown = ", ".join(str(v) for v in value[:limit])
        return shown + (f" (+{len(value) - limit} more)" if len(value) > limit else "")
    return ""


def warnings_of(record: Any) -> list[str]:
    data = as_dict(record)
    out: list[str] = []
    for source in (_mapping(data.get("metrics")), _mapping(data.get("evidence"))):
        value = source.get("warnings")
        if isinstance(value, (list, tuple)):
            out += [str(v) for v in value]
        elif isinstance(value, str) and value:
            out.append(value)
    return out


def _gradient(m: Mapping[str, Any], e: Mapping[str, Any]) -> str:
    if _has(e, "batchnorm", "batchnorm_modules") or _has(m, "batchnorm"):
        return ("BatchNorm statistics are per rank: convert with "
                "torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) before wrapping in DDP "
                "(needed when per-GPU batches are small; LayerNorm needs nothing).")
    if _has(e, "dropout", "rng_divergence"):
        return ("Random ops differ between the DDP and single-process runs: seed dropout and "
                "augmentation per rank (seed + rank) but keep model init and sampler seeds identical.")
    if str(e.get("loss_reduction", "")).lower() == "sum":
        return ("The loss sums over samples: DDP averages gradients over ranks, so use a mean "
                "reduction (or divide by the global batch size) to match large-batch training.")
    return ("DDP gradients differ from the single-process large-batch step: make the loss a mean "
            "over samples, give every rank a disjoint equal shard (DistributedSampler), keep "
            "state out of globals, and wrap the model in DDP after moving it to its device.")


def _no_sync(m: Mapping[str, Any], e: Mapping[str, Any]) -> str:
    if _has(e, "clip_per_microbatch", "clipping"):
        return ("Clip gradients once, after the last microbatch's backward (after synchronisation), "
                "never per microbatch.")
    return ("Wrap all but the last microbatch of each accumulation window in model.no_sync(), "
            "divide the loss by the number of microbatches K, and step the optimizer once per "
            "window: one all-reduce per K microbatches, same gradient as one large batch.")


def _rank_consistency(m: Mapping[str, Any], e: Mapping[str, Any]) -> str:
    if _has(e, "structure_mismatch", "structure_diff", "names", "shapes"):
        return ("Build the model identically on every rank (same modules, registration order, "
                "dtypes); never branch model construction on rank.")
    if _has(e, "buffers", "buffer_drift") or _has(m, "buffer_max_diff"):
        return ("Buffers drift across ranks: keep broadcast_buffers=True, or use SyncBatchNorm for "
                "BatchNorm models; seeds for dropout may differ per rank, weights must not.")
    return ("Parameters differ across ranks: seed model init identically (DDP broadcasts rank 0's "
            "weights at construction, so do not modify parameters after wrapping), and use "
            "per-rank seeds for dropout/augmentation only.")


def _sampler(m: Mapping[str, Any], e: Mapping[str, Any]) -> str:
    if _has(e, "same_order_each_epoch", "set_epoch_missing", "repeated_order") or _has(m, "same_order_each_epoch"):
        return "Call sampler.set_epoch(epoch) at the start of every epoch, or every epoch repeats the same order."
    if _has(e, "overlap", "duplicates", "overlapping_samples") or _has(m, "overlap", "duplicates"):
        return ("Shards overlap: use DistributedSampler(dataset, num_replicas=world_size, rank=rank, "
                "seed=<same on every rank>) and do not pass shuffle=True to the DataLoader.")
    if _has(e, "unequal_batches", "batch_counts") or _has(m, "unequal_batches"):
        return ("Ranks get different batch counts (a guaranteed hang at the end of the epoch): use "
                "DistributedSampler (pads or drops to equal length) or wrap the loop in "
                "torch.distributed.algorithms.Join for uneven inputs.")
    return ("Use DistributedSampler with the same seed on every rank and call set_epoch(epoch) "
            "every epoch; with drop_last=False some samples repeat (padding) — avoid that for evaluation.")


def _shared(m: Mapping[str, Any], e: Mapping[str, Any]) -> str:
    return ("Tie shared weights before wrapping in DDP (one Parameter object used twice, not a "
            "copy) and never re-tie after wrapping; with activation checkpointing on tied "
            "weights, use static_graph=True instead of find_unused_parameters=True.")


def _unused(m: Mapping[str, Any], e: Mapping[str, Any]) -> str:
    names = _names(e.get("unused_parameters") or e.get("parameters"))
    where = f" (unused: {names})" if names else ""
    cost = _num(m.get("find_unused_cost_pct"))
    if cost is None:
        cost = _num(m.get("find_unused_overhead_pct"))
    cost_text = f"; measured cost of find_unused_parameters=True here: {cost:.1f}% step time" if cost is not None else ""
    return ("Remove the dynamic branch so every parameter participates every step (e.g. multiply "
            f"the auxiliary head's loss by 0 instead of skipping it){where}, then set "
            f"find_unused_parameters=False{cost_text}. If the branch must stay, keep "
            "find_unused_parameters=True and accept the cost; never static_graph=True with it.")


def _straggler(m: Mapping[str, Any], e: Mapping[str, Any]) -> str:
    culprit = m.get("culprit_rank")
    who = f"rank {culprit}" if isinstance(culprit, int) and not isinstance(culprit, bool) else "the slowest rank"
    return (f"Every all-reduce waits for {who}: check its node for clock throttling "
            "(nvidia-smi -q -d CLOCK,PERFORMANCE), PCIe/NIC link retraining and noisy neighbours, "
            "and evict the node if it persists.")


def _bucket(m: Mapping[str, Any], e: Mapping[str, Any]) -> str:
    best = _num(m.get("best_bucket_cap_mb"))
    configured = _num(m.get("configured_bucket_cap_mb"))
    if best is not None:
        now = f" (configured: {configured:g} MB)" if configured is not None else ""
        return (f"Set bucket_cap_mb={best:g}, the fastest value measured{now}; re-measure when the "
                "model, world size or interconnect changes (≈25 within one NVLink node, ≈50 across nodes).")
    return ("Sweep bucket_cap_mb (≈25 within one NVLink node, ≈50 across nodes on 200/400 Gb "
            "RoCE/IB) and keep the fastest; also set gradient_as_bucket_view=True.")


def _hang(m: Mapping[str, Any], e: Mapping[str, Any]) -> str:
    if _has(e, "uneven_inputs") or _has(m, "uneven_inputs"):
        return ("Ranks run different numbers of steps: wrap the loop in "
                "torch.distributed.algorithms.Join([model]) or equalise the data per rank.")
    if _has(e, "rank0_only_collective", "collective_in_rank0_branch"):
        return ("A collective runs on rank 0 only (eval/checkpoint branch): every rank must call every "
                "collective; save checkpoints from rank 0 with all ranks at a barrier.")
    return ("Make hangs fail fast and diagnosable: pass timeout= to init_process_group, keep "
            "TORCH_NCCL_ASYNC_ERROR_HANDLING=3, enable the flight recorder "
            "(TORCH_NCCL_TRACE_BUFFER_SIZE>0, TORCH_NCCL_DUMP_ON_TIMEOUT=1), and make sure every "
            "rank reaches every collective (no rank-dependent branches around them).")


def _bandwidth(m: Mapping[str, Any], e: Mapping[str, Any]) -> str:
    cliff = m.get("cliff_world_size")
    at = f" beyond {cliff} ranks" if isinstance(cliff, (int, float)) and not isinstance(cliff, bool) else ""
    return (f"Communication stops hiding behind backward{at}: raise gradient accumulation (no_sync) or "
            "bucket_cap_mb, and check the fabric (NCCL_IB_HCA / NCCL_SOCKET_IFNAME pick the fast NIC, "
            "NCCL_P2P_DISABLE and NCCL_IB_DISABLE unset, NCCL_DEBUG=INFO shows the transport chosen).")


RULES: dict[str, Rule] = {
    "gradient-equivalence": _gradient,
    "no-sync-equivalence": _no_sync,
    "rank-consistency": _rank_consistency,
    "sampler-coverage": _sampler,
    "shared-weights": _shared,
    "unused-parameters": _unused,
    "straggler": _straggler,
    "bucket-config": _bucket,
    "hang-detection": _hang,
    "allreduce-bandwidth": _bandwidth,
}

DDP_KWARG_HINTS: tuple[tuple[str, Any, str], ...] = (
    ("gradient_as_bucket_view", False, "set gradient_as_bucket_view=True (saves one full gradient copy)"),
)


def _kwarg_hints(e: Mapping[str, Any], m: Mapping[str, Any]) -> list[str]:
    kwargs = _mapping(e.get("ddp_kwargs"))
    hints = [hint for key, bad, hint in DDP_KWARG_HINTS if key in kwargs and kwargs.get(key) == bad]
    if m.get("static_graph_eligible") is True and not kwargs.get("static_graph"):
        hints.append("the graph never changes: static_graph=True is eligible and faster")
    return hints


def recommend(record: Any) -> str | None:
    """Advice for one record (CheckRecord or dict), or ``None`` when there is nothing to say.

    The record's own ``recommendation`` wins. Failed and inconclusive checks, and passed ones
    with warnings, get the rule for their id; other passed and skipped checks get none.
    """
    data = as_dict(record)
    own = data.get("recommendation")
    if isinstance(own, str) and own.strip():
        return own.strip()
    status = data.get("status")
    metrics, evidence = _mapping(data.get("metrics")), _mapping(data.get("evidence"))
    warned = bool(warnings_of(data))
    if status not in ("failed", "inconclusive") and not warned:
        return None
    rule = RULES.get(str(data.get("id")))
    parts: list[str] = []
    if rule is not None:
        try:
            parts.append(rule(metrics, evidence))
        except Exception:  # noqa: BLE001 - malformed evidence must never break a report
            pass
    parts += [h[0].upper() + h[1:] + "." for h in _kwarg_hints(evidence, metrics)]
    if not parts and status == "inconclusive":
        parts.append("The check could not decide: read its evidence, fix the harness error, and re-run it alone with --checks.")
    return " ".join(parts) or None
