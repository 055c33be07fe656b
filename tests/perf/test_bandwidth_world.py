"""allreduce-bandwidth on real gloo worlds: the check passes on a sound world, fails when a
rank's all-reduce result is corrupted, and the step simulator predicts measured DDP steps."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest

from conformance.harness.registry import BY_ID
from conformance.perf.allreduce_bandwidth import SIMULATOR_ERROR_BOUND, judge, measure
from conformance.perf.maths.alphabeta import AlphaBeta, ring_allreduce_time
from conformance.perf.maths.simulator import ddp_bucket_caps, greedy_buckets, step_at
from conformance.perf.measure.overlap import ddp_steps
from conformance.perf.measure.profile import profile_backward, to_profile

WIDE = str(Path(__file__).with_name("wide_target.py"))
SMALL_SIZES = [4096 << k for k in range(0, 9, 2)]  # 4 KB .. 1 MB: enough to fit a line, fast


def test_check_passes_with_every_metric_the_report_draws(suite_session: Any) -> None:
    record, _ = suite_session.run_check(BY_ID["allreduce-bandwidth"], "builtin")
    assert record.status == "passed", record.message
    m = record.metrics
    assert [p["bytes"] for p in m["sweep"]][:2] == [4096, 8192] and m["sweep"][-1]["bytes"] == 16 << 20
    assert all(p["busbw_gbps"] == pytest.approx(p["algbw_gbps"]) for p in m["sweep"])  # 2(n-1)/n = 1
    # The reported alpha and beta are the fit of the reported sweep: its median relative
    # residual, recomputed from the record alone, is the one the record states (a latency
    # reported per step instead of per ring hop, or a bandwidth in bits, would miss it).
    residuals = sorted(abs(ring_allreduce_time(p["bytes"], 2, m["alpha_s"], m["beta_bytes_per_s"]) - p["time_s"])
                       / p["time_s"] for p in m["sweep"])
    assert residuals[len(residuals) // 2] == pytest.approx(m["fit_rel_residual"], abs=1e-4), m
    assert [p["world_size"] for p in m["projection"]][-1] == 1024
    assert m["projection"][0]["efficiency"] == 1.0
    assert "cliff_world_size" in m and m["key_figure"].startswith("busbw")
    assert [o["rank"] for o in m["overlap"]] == [0, 1]
    assert all(o["forward_s"] and o["backward_comm_s"] for o in m["overlap"])  # gloo fills them
    assert "simulator_error" in m and len(m["projection_by_cap"]) == 3
    assert {r["hostname"] for r in record.evidence["ranks"]} and "#wrong" in record.evidence["table"]


def test_check_fails_when_an_allreduce_result_is_wrong(suite_session: Any) -> None:
    data = measure(suite_session.world(), "mlp", sizes=SMALL_SIZES, cap_mb=None, corrupt_rank=1,
                   warmup=1, iters=3, with_model=False)
    outcome = judge(data)
    assert outcome.status == "failed"
    assert "rank 1" in outcome.message and "rank 0" not in outcome.message
    assert {w["rank"] for w in outcome.evidence["wrong_results"]} == {1}


def _predict(world: Any, spec: str, model: AlphaBeta, cap_mb: float, rounds: int = 3) -> tuple[float, float]:
    """Median predicted and measured DDP step over alternating rounds (the machine is shared
    and noisy: one round can be off by 2x on a loaded 2-core box)."""
    first, cap = ddp_bucket_caps(cap_mb)
    n = world.world_size
    predicted, measured = [], []
    for _ in range(rounds):
        profile = to_profile(world.run(profile_backward, spec)[0].value)
        buckets = greedy_buckets(profile.nbytes, cap, first_cap_bytes=first)
        predicted.append(profile.forward_s + step_at(profile, buckets, model, n).step_s)
        measured.append(statistics.median(r.value["step_s"] for r in world.run(ddp_steps, spec)))
    return statistics.median(predicted), statistics.median(measured)


@pytest.mark.slow
def test_simulator_predicts_measured_ddp_steps_at_1_and_2_ranks(suite_session: Any, pace: Any) -> None:
    """Generous bounds: two ranks share two noisy cores, and gloo's reductions steal compute
    time from backward, which the simulator does not model (seen: 20-40 % at 2 ranks). The
    bound widens with the host's measured contention (``pace``): the profile and the measured
    steps are taken at different moments, and another worker's burst can slow one of them
    alone (seen: 12 ms predicted against 40 ms measured under three xdist workers)."""
    world = suite_session.world()
    data = measure(world, "mlp", sizes=[4096 << k for k in range(0, 13, 2)], cap_mb=1, with_model=False)
    outcome = judge(data)
    model = AlphaBeta(alpha_s=outcome.metrics["alpha_s"], beta_bytes_per_s=outcome.metrics["beta_bytes_per_s"],
                      fit_world_size=2)
    # Within a factor of 3 either way: a CI box running two xdist workers on two cores can
    # slow the profiled backward or the measured step alone by 2x. The simulator's arithmetic
    # is pinned exactly by the worked-example tests; this only guards against a model that
    # has lost touch with real DDP (a missing all-reduce term, the wrong bucket layout).
    predicted, measured = _predict(world, WIDE, model, 1)
    factor = 3 * pace.measure()
    assert 1 / factor < predicted / measured < factor, (predicted, measured, factor)
    one = suite_session.world(world_size=1)
    predicted1, measured1 = _predict(one, WIDE, model, 1)
    factor = 3 * pace.measure()
    assert 1 / factor < predicted1 / measured1 < factor, (predicted1, measured1, factor)


def test_check_on_wide_target_reports_bucket_layout_and_error(suite_session: Any) -> None:
    record, _ = suite_session.run_check(BY_ID["allreduce-bandwidth"], WIDE)
    assert record.status == "passed", record.message
    assert record.metrics["bucket_layout_matches_ddp"] is True  # greedy rule == DDP's rebuilt buckets
    assert record.metrics["simulator"]["buckets"] == 6
    # Not bounded here (one noisy sample; the bound lives in the simulator test, which takes
    # medians), but it is the error of the step the record states, and the projection is
    # claimed exactly when that error is within the bound.
    simulated = record.metrics["simulator"]
    error = abs(simulated["predicted_step_s"] - simulated["measured_step_s"]) / simulated["measured_step_s"]
    assert record.metrics["simulator_error"] == pytest.approx(error, abs=1e-4), simulated
    reliable = record.metrics["simulator_error"] <= SIMULATOR_ERROR_BOUND
    assert record.metrics["projection_reliable"] is reliable, record.message
