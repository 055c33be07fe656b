"""The NCCL path of the bandwidth sweep: CUDA-event timing, sizes up to 256 MB."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu


def _gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.skipif(_gpus() < 2, reason="needs at least 2 CUDA GPUs for an NCCL all-reduce sweep")
def test_nccl_sweep_is_exact_and_fast() -> None:
    from conformance.harness.registry import BY_ID
    from conformance.harness.session import Session, Settings

    session = Session(Settings(backend="nccl", world_size=2, deadline=300.0))
    try:
        record, _ = session.run_check(BY_ID["allreduce-bandwidth"], "builtin")
    finally:
        session.close()
    assert record.status == "passed", record.message
    sizes = [p["bytes"] for p in record.metrics["sweep"]]
    assert sizes[-1] == 256 << 20
    # Any two GPUs on one node (PCIe or NVLink) move a 256 MB all-reduce faster than 1 GB/s.
    assert record.metrics["sweep"][-1]["busbw_gbps"] > 1.0
