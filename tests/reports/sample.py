"""A realistic sample run — one record of every check id, every chart type — for the README,
for the renderers' tests and for eyeballing report.html without a GPU cluster::

    python -m tests.reports.sample out/      # writes out/run.json, results.jsonl and the reports

A test fixture, not part of the package: it lives beside the tests that use it. The metric
and evidence keys are the ``reports.keys`` constants the real checks write.

The story is the incident of docs/ddp-background.md on an 8-GPU node: everything conforms except an
auxiliary head under a random branch (``unused-parameters`` fails, the hang reproduced); an
injected slow rank is named; the configured 25 MB buckets are slower than the best 50 MB.
All numbers are deterministic (seeded), so the output is stable.
"""

from __future__ import annotations

import math
import os
import random
import sys
from typing import Any

from ddp_conformance.reports import keys
from ddp_conformance.reports.environment import settings
from ddp_conformance.reports.schema import CheckRecord, Event
from ddp_conformance.reports.store import ResultStore

T0 = 1_750_000_000.0
WORLD = 8


def _environment() -> dict[str, Any]:
    env = {"NCCL_DEBUG": "WARN", "NCCL_SOCKET_IFNAME": "ens1f0", "TORCH_DISTRIBUTED_DEBUG": "INFO", "OMP_NUM_THREADS": "8"}
    return {
        "backend": "nccl", "world_size": WORLD, "hostnames": ["gpu-node-017"], "host_count": 1,
        "python": "3.11.9", "platform": "Linux-5.15.0-1063-nvidia-x86_64-with-glibc2.35",
        "cpu_count": 224, "cpu_affinity": 224, "torch": "2.4.1+cu124", "cuda": "12.4", "cudnn": 90100,
        "nccl": "2.20.5", "driver": "550.90.07", "cuda_available": True, "gpu_count": WORLD,
        "gpus": [{"index": i, "name": "NVIDIA H100 80GB HBM3", "memory_gib": 79.1, "capability": "9.0"} for i in range(WORLD)],
        "distributed_available": True, "nccl_available": True, "gloo_available": True,
        "settings": settings(env), "errors": [],
    }


def _timeline(rng: random.Random, t: float, steps: int, slow: dict[tuple[int, int], float], stop: dict[int, int] | None = None) -> list[dict[str, Any]]:
    """Steps on every rank: each step ends when the slowest rank's gradients are all-reduced."""
    rows = []
    for step in range(steps):
        durations = {rank: 0.080 + rng.uniform(0, 0.004) + slow.get((rank, step), 0.0) for rank in range(WORLD)}
        end = t + max(durations.values()) + 0.006
        for rank in range(WORLD):
            if stop and step >= stop.get(rank, steps):
                continue
            rows.append({"rank": rank, "step": step, "t_start": round(t, 4), "t_end": round(end, 4)})
        t = end + 0.002
    return rows


def sample_run(seed: int = 0) -> tuple[dict[str, Any], list[CheckRecord], list[Event]]:
    """(run.json meta, records, events) of the sample run."""
    rng = random.Random(seed)
    t = T0
    records: list[CheckRecord] = []
    events: list[Event] = []

    def rec(cid: str, title: str, kind: str, status: str, dur: float, message: str, **kw: Any) -> None:
        records.append(CheckRecord(cid, title, kind, status, dur, message, target="tied-lm", **kw))

    rec("gradient-equivalence", "Gradient equivalence", "conformance", "passed", 6.4,
        "8-rank DDP gradients match the single-process batch-64 step for all 14 parameters",
        metrics={"key_figure": "max |Δgrad| 3.2e-07 = 0.032× tolerance", "max_abs_grad_diff": 3.2e-07,
                 "grad_atol": 1e-05, "world_size": 8, "steps": 3},
        evidence={"worst_parameter": "blocks.1.mlp.fc2.weight", "ddp_kwargs": "{'bucket_cap_mb': 25, 'gradient_as_bucket_view': True}"})
    rec("no-sync-equivalence", "no_sync equivalence", "conformance", "passed", 7.9,
        "K=4 microbatches with no_sync match one large step; 1 all-reduce per window",
        metrics={"key_figure": "1 round (3 buckets)/step for K=4; max |Δgrad| 4.1e-07 = 0.041× tolerance",
                 "max_abs_grad_diff": 4.1e-07, "grad_atol": 1e-05, "allreduce_rounds_per_step": [[1, 1, 1]] * 8,
                 "microbatches": 4},
        evidence={keys.WARNINGS: ["dropout (blocks.0.drop, blocks.1.drop) was switched off in both runs: "
                                  "random masks differ between the runs by design"]})
    rec("rank-consistency", "Rank consistency", "conformance", "passed", 3.1,
        "structure, parameters and buffers identical on all 8 ranks after init and 3 steps",
        metrics={"key_figure": "16 tensor digests equal on 8 ranks", "tensors_compared": 16, "checkpoints": 7})
    rec("sampler-coverage", "Sampler coverage", "conformance", "passed", 0.4,
        "3 epochs x 8 ranks: every sample once, shards disjoint, 125 batches per rank, new order each epoch",
        metrics={"key_figure": "10 000 samples, 0 overlaps", "epochs": 3, "overlap": 0, "padding": 0})
    rec("shared-weights", "Shared weights", "conformance", "passed", 4.2,
        "tied embedding/output weight gets the summed gradient of both uses, averaged over ranks",
        metrics={"key_figure": "1 shared, 3 DDP modes, max |Δgrad| 2.4e-07", "shared_parameters": 1,
                 "max_abs_grad_diff": 2.4e-07})
    rec("unused-parameters", "Unused parameters", "chaos", "failed", 41.7,
        "hang reproduced: ranks 0-1 took the aux branch at step 3, ranks 2-7 did not\n"
        "rank 0 launched all-reduce of bucket 0 (aux_head.proj.weight, aux_head.proj.bias) that ranks 2-7 never filled; "
        "detected after 10.0 s (pg timeout)",
        metrics={keys.FIND_UNUSED_TAX: 1.142, "key_figure": "hang in 10.0 s; find_unused tax x1.14",
                 "ranks_taking_branch": [0, 1]},
        evidence={keys.UNUSED_TABLE: {name: {"ranks": [2, 3, 4, 5, 6, 7], "steps": [3], "single_sample_steps": []}
                                      for name in ("aux_head.proj.weight", "aux_head.proj.bias")},
                  "stuck_collective": "allreduce", "bucket": 0})

    slow = {(3, s): 0.045 for s in range(8, 14)}
    tl = _timeline(rng, t, 20, slow)
    t_slow0 = next(r["t_start"] for r in tl if r["step"] == 8)
    t_slow1 = next(r["t_end"] for r in tl if r["step"] == 13)
    events.append(Event("slow-rank", t_slow0, t_slow1, check="straggler", rank=3, step=8, phase="backward", data={"delay_s": 0.045, "steps": 6}))
    per_rank = []
    for rank in range(WORLD):
        compute = 0.082 + rng.uniform(0, 0.003) + (0.0135 if rank == 3 else 0.0)
        per_rank.append({"rank": rank, "compute_s": round(compute, 4), "wait_s": round(0.0985 - compute, 4), "score": round(compute / 0.082, 3)})
    rec("straggler", "Straggler", "chaos", "passed", 12.6,
        "injected slow rank 3 named (score 1.17); it cost every rank 16% step time over 6 steps",
        metrics={"per_rank": per_rank, keys.CULPRIT_RANK: 3, "timeline": tl, "injected_rank": 3, "cost_pct": 16.4})

    sizes = [1, 2, 5, 10, 25, 50, 100, 200, 400]
    sweep = [{"bucket_cap_mb": s, "step_time_s": round(0.300 + 0.022 * math.log(s / 50) ** 2 + rng.uniform(0, 0.002), 4),
              "buckets": max(1, math.ceil(1300 / s))} for s in sizes]
    rec("bucket-config", "Bucket configuration", "chaos/perf", "passed", 96.0,
        "best bucket_cap_mb=50 (300 ms/step); configured 25 MB is 2.5% slower; 1 MB buckets 6.8% slower",
        metrics={"sweep": sweep, keys.CONFIGURED_BUCKET_CAP_MB: 25, keys.BEST_BUCKET_CAP_MB: 50})

    t = T0 + 200
    hang = _timeline(rng, t, 8, {}, stop={2: 6})
    hang_start = next(r["t_start"] for r in hang if r["step"] == 6)
    events.append(Event("hang-rank", hang_start, hang_start + 0.6, check="hang-detection", rank=2, step=6, phase="allreduce"))
    rec("hang-detection", "Hang detection", "chaos", "passed", 18.3,
        "injected hang on rank 2 (step 6, allreduce) detected in 0.6 s: culprit rank 2, collective ALLREDUCE seq 37",
        metrics={"detection_latency_s": 0.6, keys.CULPRIT_RANK: 2, "timeline": hang},
        evidence={"collective": "ALLREDUCE", "seq": 37, "last_completed": {str(r): 37 if r != 2 else 36 for r in range(WORLD)}})

    alpha, beta = 12e-6, 180e9
    bw = []
    for k in range(10, 31, 2):
        size = 2**k
        time_s = 2 * (WORLD - 1) * alpha + 2 * (WORLD - 1) / WORLD * size / beta
        algbw = size / time_s / 1e9
        bw.append({"bytes": size, "time_s": time_s, "algbw_gbps": round(algbw, 3), "busbw_gbps": round(algbw * 2 * (WORLD - 1) / WORLD, 3)})
    # Efficiency as the lessons' example: ~97.5% in one NVLink node, ~81% at 64, <50% at 512.
    efficiency = {8: 0.975, 16: 0.95, 32: 0.9, 64: 0.81, 128: 0.72, 256: 0.6, 512: 0.46, 1024: 0.31}
    projection = [{"world_size": n, "step_time_s": round(0.300 / e, 4), "efficiency": e} for n, e in efficiency.items()]
    rec("allreduce-bandwidth", "All-reduce bandwidth", "perf", "passed", 22.5,
        f"peak bus bandwidth {max(p['busbw_gbps'] for p in bw):.0f} GB/s at 1 GiB; fitted alpha 12 us, beta 180 GB/s",
        metrics={"sweep": bw, "alpha_s": alpha, "beta_bytes_per_s": beta, "projection": projection,
                 keys.CLIFF_WORLD_SIZE: 512, keys.SIMULATOR_ERROR: 0.08, "projection_reliable": True},
        evidence={keys.WARNINGS: ["projected scaling cliff: from 512 ranks on, communication no longer hides "
                                  "behind backward at the configured bucket_cap_mb"]})

    meta = {"target": "tied-lm", "backend": "nccl", "world_size": WORLD, "suite": "full", "environment": _environment(),
            "started": T0 - 5, "checks_selected": [r.id for r in records]}
    return meta, records, events


def write_sample_run(directory: str | os.PathLike[str], *, seed: int = 0, complete: bool = True) -> ResultStore:
    """Write the sample run's run.json and results.jsonl (not the reports) into ``directory``."""
    meta, records, events = sample_run(seed)
    store = ResultStore(directory)
    store.start(meta)
    by_check = {e.check: e for e in events}
    for record in records:
        if record.id in by_check:
            store.append(by_check[record.id])
        store.append(record)
    if complete:
        store.update_meta(finished=T0 + 320)  # fixed, not time.time(): a stable sample
    return store


if __name__ == "__main__":  # pragma: no cover - a convenience for the README
    from .render import write_reports

    out = sys.argv[1] if len(sys.argv) > 1 else "sample-report"
    write_sample_run(out)
    report = write_reports(out)
    print(f"{out}/report.html: verdict {report['verdict']}")
