"""allreduce-bandwidth never presents an unchecked projection as a finding.

The message of a passed check may claim a scaling cliff only when the simulator predicted the
DDP step measured at this world size within ``SIMULATOR_ERROR_BOUND``; beyond it, the message
says the projection is unreliable and no cliff is claimed (metric, warning and advice agree).
The profile and DDP logging come from a real 2-rank gloo run of the wide target; the sweep
times are an exact alpha-beta line and the measured step is set relative to the prediction,
so the verdict does not depend on how loaded the machine is.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from conformance.perf.allreduce_bandwidth import SIMULATOR_ERROR_BOUND, judge, measure
from conformance.perf.maths.alphabeta import ring_allreduce_time
from ddp_conformance.reports import keys
from ddp_conformance.reports.recommend import recommend

WIDE = str(Path(__file__).with_name("wide_target.py"))
SIZES = [4096 << k for k in range(0, 9, 2)]


@pytest.fixture(scope="module")
def measured(suite_session: Any) -> dict[str, Any]:
    data = measure(suite_session.world(), WIDE, sizes=SIZES, cap_mb=1, warmup=1, iters=3)
    assert "model_error" not in data, data.get("model_error")
    exact = [ring_allreduce_time(size, 2, 50e-6, 1e8) for size in SIZES]
    data["times"] = [[[t] * 3 for t in exact] for _ in range(2)]
    return data


def _with_measured_step(data: dict[str, Any], factor: float) -> dict[str, Any]:
    """``data`` whose measured DDP step is ``factor`` times the simulator's prediction."""
    predicted = judge(copy.deepcopy(data)).metrics["simulator"]["predicted_step_s"]
    out = copy.deepcopy(data)
    for run in out["ddp"]:
        run["step_s"] = predicted * factor
    return out


def _record(outcome: Any) -> dict[str, Any]:
    return {"id": "allreduce-bandwidth", "status": outcome.status, "metrics": outcome.metrics,
            "evidence": outcome.evidence}


def test_a_simulator_far_off_the_measured_step_claims_no_cliff(measured: dict[str, Any]) -> None:
    outcome = judge(_with_measured_step(measured, 3.0))  # error = 2/3, far above the bound
    assert outcome.status == "passed", outcome.message
    assert outcome.metrics[keys.SIMULATOR_ERROR] == pytest.approx(2 / 3, rel=1e-3)
    assert "projection unreliable here" in outcome.message
    assert (f"off by 67% against the measured DDP step at 2 ranks (bound {SIMULATOR_ERROR_BOUND:.0%}), "
            f"so no scaling cliff is claimed") in outcome.message
    assert "projected cliff" not in outcome.message and "stays hidden" not in outcome.message
    assert outcome.metrics[keys.CLIFF_WORLD_SIZE] is None and outcome.metrics["projection_reliable"] is False
    assert keys.WARNINGS not in outcome.evidence
    assert recommend(_record(outcome)) is None  # a passed check with nothing confirmed to warn about


def test_a_simulator_within_the_bound_states_its_projection(measured: dict[str, Any]) -> None:
    outcome = judge(_with_measured_step(measured, 1.0))
    assert outcome.status == "passed", outcome.message
    assert outcome.metrics[keys.SIMULATOR_ERROR] == pytest.approx(0.0, abs=1e-4)
    assert outcome.metrics["projection_reliable"] is True
    # At 100 MB/s no backward hides the wide target's all-reduces: the cliff is at 2 ranks.
    assert outcome.metrics[keys.CLIFF_WORLD_SIZE] == 2
    assert "projected cliff at 2 ranks (simulator within 0% of the measured step at 2 ranks)" \
        in outcome.message
    assert "from 2 ranks on" in outcome.evidence[keys.WARNINGS][0]
    assert "from 2 ranks on" in (recommend(_record(outcome)) or "")


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
def test_the_advice_for_a_projected_cliff_names_the_settings_of_the_backend_it_was_measured_on(
        measured: dict[str, Any], backend: str) -> None:
    """A cliff projected from gloo's link: NCCL's fabric settings would name a cause that is not
    there (they were advised on a gloo CPU run of openai/guided-diffusion's classifier)."""
    outcome = judge({**_with_measured_step(measured, 1.0), "backend": backend})
    assert outcome.metrics[keys.CLIFF_WORLD_SIZE] == 2 and outcome.metrics["backend"] == backend
    advice = recommend(_record(outcome)) or ""
    assert "from 2 ranks on" in advice
    if backend == "gloo":
        assert "NCCL_" not in advice and "GLOO_SOCKET_IFNAME" in advice and "--backend nccl" in advice
    else:
        assert "NCCL_IB_HCA" in advice and "GLOO_" not in advice


def test_the_bound_is_the_edge(measured: dict[str, Any]) -> None:
    """Just inside the bound claims, just outside does not."""
    inside = judge(_with_measured_step(measured, 1 / (1 - SIMULATOR_ERROR_BOUND * 0.9)))
    outside = judge(_with_measured_step(measured, 1 / (1 - SIMULATOR_ERROR_BOUND * 1.1)))
    assert inside.metrics["projection_reliable"] is True, inside.message
    assert outside.metrics["projection_reliable"] is False, outside.message


def test_timings_too_noisy_to_fit_are_inconclusive_with_a_rerun_advice(measured: dict[str, Any]) -> None:
    noisy = copy.deepcopy(measured)
    jumps = [1e-3, 1e-6, 5e-2, 1e-6, 2e-2]  # no line fits these: the alpha-beta fit is rejected
    noisy["times"] = [[[t] * 3 for t in jumps] for _ in range(2)]
    outcome = judge(noisy)
    assert outcome.status == "inconclusive", outcome.message
    assert "the timings are noise" in outcome.message  # the line falls with message size
    assert keys.CLIFF_WORLD_SIZE not in outcome.metrics  # nothing projected from an unfitted line
    assert "re-run the check alone on an idle machine" in (recommend(_record(outcome)) or "")
