"""ddp-migration's hazards (``conformance.perf.migration.hazards``), each from a measurement of the
port's run or a ``ddp_kwargs`` key the target sets; none said without one (issue 40). No world."""

from __future__ import annotations

from conformance.perf.migration import StepCost, hazards


def _port(**measured: int) -> list[StepCost]:
    figures = {"optimizer_state_dtensors": 0, "optimizer_state_tensors": 4, "dtensor_grads": 0, "grads": 4,
               "scaler_steps": 0, **measured}
    return [StepCost("fully_shard", 0, 2**20, 0, None, 0.01, {}, {}, **figures)]


def test_a_port_with_nothing_measured_and_no_ddp_kwargs_has_no_hazard() -> None:
    assert hazards({}, _port()) == []


def test_each_hazard_is_said_only_where_measured() -> None:
    said = hazards({"broadcast_buffers": True, "bucket_cap_mb": 50, "process_group": object()},
                   _port(optimizer_state_dtensors=4, dtensor_grads=4, scaler_steps=3))
    assert [h.split(":")[0] for h in said] == [
        "ddp_kwargs broadcast_buffers=True has no FSDP2 meaning", "ddp_kwargs bucket_cap_mb=50 has no FSDP2 meaning",
        "clipping on DTensors", "optimizer state dict format", "grad scaler"], said
    assert "FSDP2 never broadcasts buffers" in said[0]
    assert "GradScaler.step ran 3 time(s) on sharded gradients" in said[4]


def test_ddp_kwargs_are_no_hazard_of_the_ddp_based_replicate() -> None:
    port = [StepCost("replicate", 0, 2**20, 0, None, 0.01, {}, {}, 0, 4, 0, 4, 0)]
    assert hazards({"bucket_cap_mb": 50}, port) == []
