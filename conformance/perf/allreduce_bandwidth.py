"""``allreduce-bandwidth``: is the all-reduce correct and fast here, and where does scaling break?

Contract enforced: an all-reduce SUM returns the exact sum on every rank (DDP's gradient
averaging is nothing else — docs/ddp-background.md, "Why DDP equals large-batch training"), at a bus
bandwidth reported the nccl-tests way (``busbw = algbw * 2(n-1)/n``).

Evidence: a sweep of message sizes (4 KiB..16 MiB on gloo/CPU, 4 KiB..256 MiB on NCCL; warm-up,
then 10 timed iterations per size, median of the slowest rank), every result checked
element-wise; a weighted least-squares alpha-beta fit of the ring model; the bucketed,
overlapped DDP step simulated from the target's measured per-gradient backward timeline and
projected to 1..1024 ranks for three bucket caps (the scaling cliff: where communication stops
hiding behind backward); the simulator checked against a measured DDP step at this world
size (the timeline and the step measured on one build of the model, each timed until its
median is pinned: ``measure.model_step``; measured once, however many sweeps the fit takes);
DDP's own overlap accounting per rank; each rank's host and node.

Verdict: failed if any all-reduce result was wrong; inconclusive if the timings cannot be
fitted (noise, non-positive times); passed otherwise. The projection informs, it never fails:
a cliff is claimed (metric ``cliff_world_size`` and a warning) only when the simulator
predicted the measured DDP step within ``SIMULATOR_ERROR_BOUND``; otherwise the message says
the projection is unreliable here and no cliff is claimed.

    ddp-conformance run --checks allreduce-bandwidth
    ddp-conformance run --checks allreduce-bandwidth --backend nccl --world-size 8
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \\
        -m conformance run --attach --backend nccl --checks allreduce-bandwidth
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from ddp_conformance.reports.keys import CLIFF_WORLD_SIZE, PROJECTION_RELIABLE, SIMULATOR_ERROR, WARNINGS
from ddp_conformance.reports.units import fmt_bytes

from ..harness.context import CheckContext
from ..harness.outcome import Outcome
from ..harness.timing import DEFAULT_DEADLINE_S
from ..harness.world import WorldError, WorldLike
from .maths import MB, AlphaBeta, BackwardProfile, ddp_bucket_caps, fit_alpha_beta, greedy_buckets, project, step_at
from .maths import bandwidth as bw
from .measure import (
    ITERS,
    WARMUP,
    OverlapSample,
    allreduce_sweep,
    default_sizes,
    model_timings,
    parse_bucket_indices,
    split_sweep,
    to_profile,
)

SPLIT_SIZES = tuple(4096 << k for k in range(0, 13, 3))  # a shorter sweep per link kind
# The projection to 1024 ranks stands on the simulator, and the only world it can be checked
# on is this one. DDP's fixed per-step costs that the simulator leaves out (hooks, the
# reducer) stay well under a quarter of a real step; a larger miss means it is missing
# something that matters here (cores shared with gloo's reductions, another bucket layout),
# and extrapolating it hundreds of times further would be presenting a guess as a finding.
SIMULATOR_ERROR_BOUND = 0.25


#: How many sweeps the check measures before it calls the host too noisy to fit. A fit that
#: fails on a shared host is often one burst of contention (another job, a test worker); a
#: person would measure again, and so does the check, a bounded number of times. The record
#: says how many sweeps it took. Under --attach every rank holds the same gathered timings, so
#: every rank makes the same decision and the re-measurement stays collective.
SWEEP_ATTEMPTS = 3
#: What :func:`measure` adds with ``with_model``: the model's part of the data.
MODEL_KEYS = ("profile", "ddp", "model_work", "model_phases_s", "model_error")


def run(ctx: CheckContext) -> Outcome:
    if ctx.world_size < 2:
        return Outcome.skipped(f"world_size={ctx.world_size}: one rank all-reduces nothing; "
                               f"run with --world-size 2 or more")
    model: dict[str, Any] = {}
    for attempt in range(1, SWEEP_ATTEMPTS + 1):
        # The model's part (the backward profile, the measured DDP step) is measured with the
        # first sweep only: a re-measurement is for the sweep's fit, which it does not enter,
        # and at production size it is most of the check's time.
        data = measure(ctx.world(), ctx.target.spec, sizes=default_sizes(ctx.backend),
                       cap_mb=ctx.target.ddp_kwargs.get("bucket_cap_mb"), deadline=ctx.deadline,
                       with_model=attempt == 1)
        model = model or {k: data[k] for k in MODEL_KEYS if k in data}
        # The backend rides along: the advice for a projected cliff names its transport's settings.
        outcome = judge({**data, **model, "backend": ctx.backend})
        if outcome.metrics.get("fit_sane", True):
            break
    return replace(outcome, metrics={**outcome.metrics, "sweep_attempts": attempt})


def measure(world: WorldLike, target_spec: str, *, sizes: Sequence[int], cap_mb: float | None,
            corrupt_rank: int | None = None, warmup: int = WARMUP, iters: int = ITERS,
            with_model: bool = True, deadline: float = DEFAULT_DEADLINE_S) -> dict[str, Any]:
    """Run everything on ``world``; returns plain data for :func:`judge`. ``deadline``: the
    world's, which bounds the backward profile's passes and the DDP steps (model_step).

    ``corrupt_rank`` injects a wrong all-reduce result on that rank (tests prove the check fails).
    """
    results = world.run(allreduce_sweep, list(sizes), warmup=warmup, iters=iters, corrupt_rank=corrupt_rank)
    data: dict[str, Any] = {
        "world_size": len(results), "sizes": list(sizes), "iters": iters, "cap_mb": cap_mb,
        "ranks": [{"rank": r.rank, "hostname": r.hostname, "pid": r.pid, "node": r.value["node"],
                   "local_rank": r.value["local_rank"]} for r in results],
        "times": [r.value["times"] for r in results], "wrong": [r.value["wrong"] for r in results],
    }
    if len({r["node"] for r in data["ranks"]}) > 1:
        # Several nodes: measure intra- and inter-node links apart (a no-op with one rank per node).
        split = world.run(split_sweep, list(SPLIT_SIZES), warmup=warmup, iters=iters)
        data["split"] = [r.value for r in split]
    if with_model:
        # The model part is advice, not the verdict: a target whose model cannot be profiled
        # still gets its bandwidth judged, with the error in the evidence.
        try:
            timed = world.run(model_timings, target_spec, deadline_s=deadline)
            data["profile"] = timed[0].value["profile"]
            data["ddp"] = [r.value["ddp"] for r in timed]
            data["model_work"] = timed[0].value["work"]
            data["model_phases_s"] = [r.value["phases_s"] for r in timed]
        except WorldError as exc:
            data["model_error"] = str(exc)
    return data


def _points(times: list[list[list[float]]], wrong: list[list[int]], sizes: Sequence[int], n: int,
            iters: int) -> list[bw.SweepPoint]:
    return [bw.SweepPoint(nbytes=size, time_s=bw.median_of_slowest([t[i] for t in times]), world_size=n,
                          iterations=iters, wrong=sum(w[i] for w in wrong)) for i, size in enumerate(sizes)]


def judge(data: dict[str, Any]) -> Outcome:
    n = data["world_size"]
    points = _points(data["times"], data["wrong"], data["sizes"], n, data["iters"])
    metrics: dict[str, Any] = {"sweep": [p.to_metric() for p in points if p.usable],
                               "key_figure": bw.key_figure(points), "backend": data.get("backend")}
    hosts = sorted({r["hostname"] for r in data["ranks"]})
    nodes = sorted({r["node"] for r in data["ranks"]})
    evidence: dict[str, Any] = {"table": bw.nccl_tests_table(points), "ranks": data["ranks"],
                                "hostnames": hosts, "notes": []}
    metrics["topology"] = {"world_size": n, "hosts": len(hosts), "nodes": len(nodes)}
    _topology_notes(data, metrics, evidence, nodes, hosts)
    bad = [{"rank": r, "bytes": size, "wrong_iterations": w}
           for r, per in enumerate(data["wrong"]) for size, w in zip(data["sizes"], per) if w]
    if bad:
        evidence["wrong_results"] = bad
        where = ", ".join(f"rank {b['rank']} @{fmt_bytes(b['bytes'])}" for b in bad[:6])
        return Outcome.failed(
            f"{sum(b['wrong_iterations'] for b in bad)} all-reduce result(s) differ from the exact sum ({where})",
            metrics=metrics, evidence=evidence,
            recommendation="A collective returned a wrong sum: suspect the node (GPU memory, NIC, "
                           "driver/NCCL version mismatch); rerun with NCCL_DEBUG=INFO and evict the host.")
    try:
        model = fit_alpha_beta([p.nbytes for p in points], [p.time_s for p in points], n)
    except ValueError as exc:
        metrics["fit_sane"] = False
        return Outcome.inconclusive(f"timings unusable: {exc}", metrics=metrics, evidence=evidence)
    metrics.update(alpha_s=model.alpha_s, beta_bytes_per_s=model.beta_bytes_per_s,
                   fit_rel_residual=round(model.median_rel_residual, 4))
    if model.intercept_clamped:
        evidence["notes"].append("fitted latency was negative (noise) and clamped to 0")
    metrics["fit_sane"] = model.sane
    if not model.sane:
        return Outcome.inconclusive(
            f"the alpha-beta fit does not describe the sweep (median residual "
            f"{model.median_rel_residual:.0%}); the machine is too noisy to measure", metrics=metrics,
            evidence=evidence)
    summary = _model_part(data, model, metrics, evidence)
    return Outcome.passed(f"all {len(points) * n * data['iters']} results exact; {metrics['key_figure']}; "
                          f"alpha {model.alpha_s * 1e6:.1f} us, beta {model.beta_bytes_per_s / 1e9:.2f} GB/s"
                          f"{summary}", metrics=metrics, evidence=evidence)


def _topology_notes(data: dict[str, Any], metrics: dict[str, Any], evidence: dict[str, Any],
                    nodes: list[str], hosts: list[str]) -> None:
    if len(nodes) == 1:
        evidence["notes"].append("all ranks on one node: the sweep measures intra-node links only")
    elif all(len([r for r in data["ranks"] if r["node"] == k]) == 1 for k in nodes):
        evidence["notes"].append(f"one rank per node ({len(nodes)} nodes): the sweep measures inter-node links only")
    if len(nodes) > 1 and len(hosts) == 1:
        evidence["notes"].append(f"{len(nodes)} launcher nodes share one host ({hosts[0]}): intra- and "
                                 f"inter-node bandwidth are the same loopback path here and do not differ")
    split = data.get("split")
    if split and any(s for s in split):
        out: dict[str, Any] = {}
        for kind in ("intra", "inter"):
            members = [s[kind] for s in split if s and s.get(kind)]
            if members:
                size = next(s["group_sizes"][kind] for s in split if s and s.get(kind))
                pts = _points([m["times"] for m in members], [m["wrong"] for m in members],
                              list(SPLIT_SIZES), size, data["iters"])
                out[kind] = {"group_size": size, "sweep": [p.to_metric() for p in pts if p.usable],
                             "key_figure": bw.key_figure(pts)}
        metrics["bandwidth_split"] = out


def _model_part(data: dict[str, Any], model: AlphaBeta, metrics: dict[str, Any], evidence: dict[str, Any]) -> str:
    """Projection and simulator validation; returns a message suffix."""
    if "model_error" in data:
        evidence["model_error"] = data["model_error"]
        metrics[CLIFF_WORLD_SIZE] = None
        return "; no projection (the target model could not be profiled, see evidence)"
    if "profile" not in data:
        return ""
    profile = to_profile(data["profile"])
    configured = data["cap_mb"]
    base = configured if configured is not None else 25.0
    caps: list[float | None] = [configured, base / 4, base * 4]
    projections = [project(profile, model, bucket_cap_mb=c) for c in caps]
    main = projections[0]
    metrics["projection"] = [{k: p[k] for k in ("world_size", "step_time_s", "efficiency")} for p in main.points]
    metrics["projection_by_cap"] = [p.to_metric() | {"bucket_cap_mb": c if c is not None else 25.0}
                                    for p, c in zip(projections, caps)]
    metrics["model_gradient_bytes"] = profile.total_bytes
    # What the model's part ran (rank 0's counts) and where each rank's time went: its cost.
    metrics["model_work"] = data.get("model_work")
    metrics["model_phases_s"] = data.get("model_phases_s")
    metrics["backward_s"] = profile.backward_end_s
    if len({p.buckets for p in projections}) == 1:
        evidence["notes"].append(f"the model's {fmt_bytes(profile.total_bytes)} of gradients make "
                                 f"{main.buckets} bucket(s) at every cap tried: bucket_cap_mb does not move the cliff")
    _validate(data, profile, model, metrics, evidence)
    return _projection_claim(main.cliff_world_size, int(main.points[-1]["world_size"]),
                             metrics.get(SIMULATOR_ERROR), data["world_size"], metrics, evidence)


def _projection_claim(cliff: int | None, largest: int, error: float | None, n: int,
                      metrics: dict[str, Any], evidence: dict[str, Any]) -> str:
    """What the message may say about the projection: a cliff only when the simulator was
    checked against a measured step and stayed within :data:`SIMULATOR_ERROR_BOUND`."""
    reliable = error is not None and error <= SIMULATOR_ERROR_BOUND
    metrics[PROJECTION_RELIABLE] = reliable
    metrics[CLIFF_WORLD_SIZE] = cliff if reliable else None
    if not reliable:
        metrics["unconfirmed_cliff_world_size"] = cliff
        why = ("no DDP step was measured to check it against" if error is None else
               f"the simulator is off by {error:.0%} against the measured DDP step at {n} ranks "
               f"(bound {SIMULATOR_ERROR_BOUND:.0%})")
        evidence["notes"].append(f"projection unreliable: {why}; no scaling cliff is claimed. Re-run "
                                 f"on an idle machine (or on the production GPUs) to project.")
        return f"; projection unreliable here: {why}, so no scaling cliff is claimed"
    within = f" (simulator within {error:.0%} of the measured step at {n} ranks)"
    if cliff is None:
        return f"; communication stays hidden up to {largest} ranks{within}"
    evidence[WARNINGS] = [f"projected scaling cliff: from {cliff} ranks on, communication no "
                          f"longer hides behind backward at the configured bucket_cap_mb"]
    return f"; projected cliff at {cliff} ranks{within}"


def _validate(data: dict[str, Any], profile: BackwardProfile, model: AlphaBeta, metrics: dict[str, Any],
              evidence: dict[str, Any]) -> None:
    """Predicted vs measured DDP step at this world size, on DDP's own bucket layout."""
    runs = data.get("ddp") or []
    if not runs:
        return
    n = data["world_size"]
    metrics["overlap"] = [OverlapSample.from_logging(r, run["logging"]).to_metric() for r, run in enumerate(runs)]
    logging = runs[0]["logging"]
    order = data["profile"]["order"]  # backward position -> parameter index
    position = {param: pos for pos, param in enumerate(order)}
    first, cap = ddp_bucket_caps(data["cap_mb"])
    greedy = [[order[i] for i in b] for b in greedy_buckets(profile.nbytes, cap, first_cap_bytes=first)]
    ddp_layout = parse_bucket_indices(logging.get("rebuilt_per_bucket_param_indices", ""))
    evidence["buckets"] = {"predicted": greedy, "ddp_rebuilt": ddp_layout or None,
                           "ddp_bucket_sizes": logging.get("rebuilt_bucket_sizes") or logging.get("bucket_sizes")}
    layout = ddp_layout if ddp_layout and all(i in position for b in ddp_layout for i in b) else greedy
    metrics["bucket_layout_matches_ddp"] = (sorted(map(sorted, greedy)) == sorted(map(sorted, ddp_layout))
                                            if ddp_layout else None)
    timing = step_at(profile, [[position[i] for i in b] for b in layout], model, n)
    predicted = profile.forward_s + timing.step_s
    measured = statistics.median(run["step_s"] for run in runs)
    metrics["simulator"] = {"world_size": n, "predicted_step_s": predicted, "measured_step_s": measured,
                            "buckets": len(layout)}
    metrics[SIMULATOR_ERROR] = round(abs(predicted - measured) / measured, 4)
    if profile.total_bytes < 1 * MB:
        evidence["notes"].append("the model is small: DDP's fixed per-step overhead (hooks, reducer) "
                                 "dominates its step, which the simulator does not model")
