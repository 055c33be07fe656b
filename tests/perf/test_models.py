"""Pure math of conformance.perf: bus bandwidth, the alpha-beta fit, bucketing, the overlapped
step simulator, the projection, and the bandwidth judge on hand-made data. No processes."""

from __future__ import annotations

import math
from typing import Any

import pytest

from conformance.perf.maths import (
    BackwardProfile,
    SweepPoint,
    bus_factor,
    busbw,
    ddp_bucket_caps,
    fit_alpha_beta,
    greedy_buckets,
    median_of_slowest,
    project,
    ring_allreduce_time,
    simulate,
    simulate_layers,
)
from conformance.perf.allreduce_bandwidth import judge
from conformance.perf.maths.alphabeta import AlphaBeta
from conformance.perf.measure.overlap import OverlapSample, parse_bucket_indices

MB = 1 << 20


# -- bus bandwidth (nccl-tests doc/PERFORMANCE.md) -------------------------------------------

@pytest.mark.parametrize(("n", "factor"), [(1, 0.0), (2, 1.0), (4, 1.5), (8, 1.75)])
def test_bus_factor_is_2_n_minus_1_over_n(n: int, factor: float) -> None:
    assert bus_factor(n) == pytest.approx(factor)


def test_busbw_hand_computed() -> None:
    # 1 GB in 0.1 s on 8 ranks: algbw 10 GB/s, busbw 10 * 14/8 = 17.5 GB/s.
    p = SweepPoint(nbytes=10**9, time_s=0.1, world_size=8, iterations=5)
    assert p.algbw_gbps == pytest.approx(10.0)
    assert p.busbw_gbps == pytest.approx(17.5)
    assert busbw(4 * MB, 0.004, 2) == pytest.approx(4 * MB / 0.004)
    assert p.to_metric() == {"bytes": 10**9, "time_s": 0.1, "algbw_gbps": 10.0, "busbw_gbps": 17.5}


def test_busbw_rejects_non_positive_time() -> None:
    with pytest.raises(ValueError, match="time_s=0 must be a positive"):
        busbw(1024, 0, 2)


def test_median_of_slowest_rank_per_iteration() -> None:
    # iteration maxima: 3, 5, 4 -> median 4
    assert median_of_slowest([[1, 5, 4], [3, 2, 1]]) == 4
    assert math.isnan(median_of_slowest([]))


# -- alpha-beta fit ------------------------------------------------------------------------

def test_fit_recovers_alpha_and_beta() -> None:
    alpha, beta, n = 20e-6, 5e9, 4
    sizes = [4096 << k for k in range(13)]
    times = [ring_allreduce_time(v, n, alpha, beta) for v in sizes]
    fit = fit_alpha_beta(sizes, times, n)
    assert fit.alpha_s == pytest.approx(alpha, rel=1e-6)
    assert fit.beta_bytes_per_s == pytest.approx(beta, rel=1e-6)
    assert fit.sane and fit.median_rel_residual < 1e-9
    # T = 2(N-1) alpha + 2(N-1)/N V/beta, by hand for 1 MB on 4 ranks:
    assert fit.allreduce_time(MB, 4) == pytest.approx(6 * alpha + 1.5 * MB / beta)
    assert fit.allreduce_time(MB, 1) == 0.0


def test_fit_refuses_unusable_timings() -> None:
    with pytest.raises(ValueError, match="at least 2 ranks"):
        fit_alpha_beta([1, 2], [1e-3, 2e-3], 1)
    with pytest.raises(ValueError, match="fewer than 2 distinct sizes"):
        fit_alpha_beta([1024, 2048], [0.0, float("nan")], 2)
    with pytest.raises(ValueError, match="does not grow with message size"):
        fit_alpha_beta([1024, 2048, 4096], [3e-3, 2e-3, 1e-3], 2)


# -- bucketing and the simulator (docs/ddp-background.md, "Scaling cliffs") ---------------------------------

def test_greedy_bucketing_seed_example() -> None:
    buckets = greedy_buckets([2 * MB] * 40, 10 * MB)
    assert len(buckets) == 8 and all(len(b) == 5 for b in buckets)
    # DDP's default first bucket of 1 MB takes one 2 MB gradient alone: 1 + 8 (last one partial).
    assert len(greedy_buckets([2 * MB] * 40, 10 * MB, first_cap_bytes=1 * MB)) == 9
    assert greedy_buckets([30 * MB, 1, 1], 10 * MB) == [[0], [1, 2]]


def test_ddp_bucket_caps_follow_torch() -> None:
    assert ddp_bucket_caps(None) == (1 * MB, 25 * MB)  # default: small first bucket
    assert ddp_bucket_caps(50) == (50 * MB, 50 * MB)  # explicit cap: no special first bucket
    with pytest.raises(ValueError, match="must be positive"):
        ddp_bucket_caps(0)


def test_simulator_seed_worked_example() -> None:
    # 30 layers x 10 ms, 6 buckets x 12 ms, each bucket = 5 consecutive layers.
    s = simulate_layers([0.010] * 30, [4, 9, 14, 19, 24, 29], [0.012] * 6)
    assert s.serial_s == pytest.approx(0.372)
    assert s.step_s == pytest.approx(0.312)
    assert s.backward_end_s == pytest.approx(0.300)  # perfectly hidden would be 300 ms
    assert s.exposed_s == pytest.approx(0.012) and s.hidden  # 4 % < the 5 % cliff tolerance


def test_simulator_queues_on_one_stream() -> None:
    # Both buckets released at 1 ms; the second waits for the first: 1 + 5 + 5 = 11 ms.
    assert simulate(0.002, [0.001, 0.001], [0.005, 0.005]).step_s == pytest.approx(0.011)
    with pytest.raises(ValueError, match="2 release times but 1"):
        simulate(1.0, [0.1, 0.2], [0.1])


def _profile(layers: int = 40, layer_s: float = 0.002, grad: int = 2 * MB) -> BackwardProfile:
    return BackwardProfile(ready_s=tuple(layer_s * (i + 1) for i in range(layers)), nbytes=(grad,) * layers,
                           backward_end_s=layer_s * layers, forward_s=0.04)


def test_projection_finds_the_cliff_and_bucket_cap_moves_it() -> None:
    model = AlphaBeta(alpha_s=20e-6, beta_bytes_per_s=20e9, fit_world_size=2)
    small = project(_profile(), model, bucket_cap_mb=1)
    big = project(_profile(), model, bucket_cap_mb=80)
    assert small.buckets == 40 and big.buckets == 1
    eff = [p["efficiency"] for p in small.points]
    assert eff[0] == 1.0 and all(a >= b for a, b in zip(eff, eff[1:]))  # weak scaling only loses
    assert small.cliff_world_size is not None and small.cliff_world_size > 1
    # One 80 MB bucket released at the very end of backward hides nothing: cliff at 2 ranks.
    assert big.cliff_world_size == 2
    assert small.cliff_world_size > big.cliff_world_size


# -- DDP logging data --------------------------------------------------------------------------

def test_overlap_sample_from_ddp_logging_ns() -> None:
    data = {"avg_forward_compute_time": 2_000_000, "avg_backward_compute_time": 5_000_000,
            "avg_backward_comm_time": 3_000_000, "avg_backward_compute_comm_overlap_time": 0}
    assert OverlapSample.from_logging(1, data).to_metric() == {
        "rank": 1, "forward_s": 0.002, "backward_compute_s": 0.005, "backward_comm_s": 0.003, "overlap_s": None}
    assert parse_bucket_indices("15 14 13 12, 11 10") == [[15, 14, 13, 12], [11, 10]]


# -- the judge on hand-made sweeps --------------------------------------------------------------

def _data(times_per_size: list[float], wrong: list[list[int]] | None = None) -> dict:
    sizes = [4096 << k for k in range(len(times_per_size))]
    per_rank = [[[t] * 3 for t in times_per_size] for _ in range(2)]
    return {"world_size": 2, "sizes": sizes, "iters": 3, "cap_mb": None,
            "ranks": [{"rank": r, "hostname": "h", "pid": 1, "node": "h", "local_rank": r} for r in range(2)],
            "times": per_rank, "wrong": wrong or [[0] * len(sizes), [0] * len(sizes)]}


def test_judge_passes_exact_and_fittable_sweep() -> None:
    times = [ring_allreduce_time(4096 << k, 2, 50e-6, 1e9) for k in range(8)]
    outcome = judge(_data(times))
    assert outcome.status == "passed", outcome.message
    assert outcome.metrics["alpha_s"] == pytest.approx(50e-6, rel=1e-6)
    assert outcome.metrics["key_figure"].startswith("busbw ")
    assert set(outcome.metrics["sweep"][0]) == {"bytes", "time_s", "algbw_gbps", "busbw_gbps"}
    assert "#wrong" in outcome.evidence["table"]


def test_judge_fails_on_a_wrong_result() -> None:
    times = [ring_allreduce_time(4096 << k, 2, 50e-6, 1e9) for k in range(4)]
    outcome = judge(_data(times, wrong=[[0, 0, 0, 0], [0, 2, 0, 0]]))
    assert outcome.status == "failed"
    assert "rank 1 @8 KiB" in outcome.message
    assert outcome.evidence["wrong_results"] == [{"rank": 1, "bytes": 8192, "wrong_iterations": 2}]


def test_judge_is_inconclusive_on_unusable_timings() -> None:
    assert judge(_data([0.0, 0.0, 0.0])).status == "inconclusive"
    noisy = judge(_data([1e-3, 1e-6, 5e-2, 1e-6, 2e-2, 1e-6]))
    assert noisy.status == "inconclusive", noisy.message


def _noisy_then(clean_after: int, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make the check's measurement noisy for ``clean_after`` sweeps, then clean."""
    from conformance.perf import allreduce_bandwidth

    calls: list[int] = []
    clean = [ring_allreduce_time(4096 << k, 2, 50e-6, 1e9) for k in range(8)]
    noisy = [1e-3, 1e-6, 5e-2, 1e-6, 2e-2, 1e-6, 3e-2, 1e-6]

    def fake_measure(*_args: Any, **_kwargs: Any) -> dict:
        calls.append(1)
        return _data(noisy if len(calls) <= clean_after else clean)

    monkeypatch.setattr(allreduce_bandwidth, "measure", fake_measure)
    return calls


def _ctx() -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(world_size=2, world=lambda: None, backend="gloo", deadline=60.0,
                           target=SimpleNamespace(spec="mlp", ddp_kwargs={}))


def test_a_noisy_sweep_is_measured_again_before_the_host_is_called_noisy(monkeypatch: pytest.MonkeyPatch) -> None:
    from conformance.perf import allreduce_bandwidth

    calls = _noisy_then(1, monkeypatch)
    outcome = allreduce_bandwidth.run(_ctx())
    assert outcome.status == "passed", outcome.message
    assert len(calls) == 2 and outcome.metrics["sweep_attempts"] == 2


def test_a_host_noisy_in_every_sweep_is_inconclusive_after_the_bounded_attempts(monkeypatch: pytest.MonkeyPatch) -> None:
    from conformance.perf import allreduce_bandwidth

    calls = _noisy_then(99, monkeypatch)
    outcome = allreduce_bandwidth.run(_ctx())
    assert outcome.status == "inconclusive" and "noise" in outcome.message, outcome.message
    assert len(calls) == allreduce_bandwidth.SWEEP_ATTEMPTS == outcome.metrics["sweep_attempts"]


def test_the_model_is_measured_with_the_first_sweep_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """A noisy sweep is measured again, the model's part (backward profile, DDP steps: most of
    the check's time at production size) is not: it does not enter the sweep's fit, and the
    judge of the second sweep still gets the first one's model data."""
    from conformance.perf import allreduce_bandwidth

    asked: list[bool] = []
    clean = [ring_allreduce_time(4096 << k, 2, 50e-6, 1e9) for k in range(8)]
    noisy = [1e-3, 1e-6, 5e-2, 1e-6, 2e-2, 1e-6, 3e-2, 1e-6]

    def fake_measure(*_args: Any, with_model: bool = True, **_kwargs: Any) -> dict:
        asked.append(with_model)
        data = _data(noisy if len(asked) == 1 else clean)
        return {**data, "model_error": "measured once"} if with_model else data

    monkeypatch.setattr(allreduce_bandwidth, "measure", fake_measure)
    outcome = allreduce_bandwidth.run(_ctx())
    assert outcome.status == "passed" and outcome.metrics["sweep_attempts"] == 2, outcome.message
    assert asked == [True, False]
    assert outcome.evidence["model_error"] == "measured once"  # the first sweep's model data, judged
