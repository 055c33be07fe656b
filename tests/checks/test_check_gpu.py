"""The equivalence and consistency checks on NCCL (models and batches on each rank's GPU, TF32
off). Skipped with the reason where fewer than 2 CUDA GPUs are visible."""

from __future__ import annotations

import pytest

from ._check_helpers import target_spec

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def nccl_session():
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 CUDA GPUs for an NCCL world of 2; {torch.cuda.device_count()} visible")
    from conformance.harness.session import Session, Settings

    session = Session(Settings(backend="nccl", world_size=2, deadline=120.0))
    yield session
    session.close()


@pytest.mark.parametrize("check_id, target, status", [
    ("gradient-equivalence", "tied-lm", "passed"),
    ("gradient-equivalence", "adam_loss_times_world", "failed"),
    ("no-sync-equivalence", "convbn", "passed"),
    ("no-sync-equivalence", "forgot_no_sync", "failed"),
    ("rank-consistency", "bn_no_broadcast", "failed"),
    ("shared-weights", "tied-lm", "passed"),
])
def test_checks_on_nccl(nccl_session, check_id, target, status):
    from conformance.harness.registry import BY_ID

    record, _ = nccl_session.run_check(BY_ID[check_id], target_spec(target))
    assert record.status == status, record.message
