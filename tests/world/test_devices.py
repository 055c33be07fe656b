"""Backend resolution and GPU partitioning between pytest-xdist workers (no GPU needed)."""

from __future__ import annotations

import pytest

from conformance.harness.world import WorldUnavailable, devices


@pytest.fixture
def gpus(monkeypatch):
    def set_count(n: int) -> None:
        monkeypatch.setattr(devices, "gpu_count", lambda: n)
    return set_count


@pytest.mark.parametrize(("worker", "workers", "expected"), [
    ("", "1", [0, 1, 2, 3, 4, 5, 6, 7]),
    ("gw0", "2", [0, 1, 2, 3]),
    ("gw1", "2", [4, 5, 6, 7]),
    ("gw2", "4", [4, 5]),
])
def test_xdist_workers_get_disjoint_gpu_slices(gpus, monkeypatch, worker, workers, expected) -> None:
    gpus(8)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", workers)
    assert devices.my_gpus() == expected


def test_auto_backend_is_nccl_only_with_two_gpus(gpus, monkeypatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    gpus(1)
    assert devices.resolve_backend("auto") == "gloo"
    gpus(2)
    assert devices.resolve_backend("auto") == "nccl"
    assert devices.default_world_size("nccl") == 2
    assert devices.default_world_size("gloo") == 2


def test_nccl_world_sizes_are_checked_against_visible_gpus(gpus, monkeypatch) -> None:
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    gpus(0)
    with pytest.raises(WorldUnavailable, match="--backend nccl needs GPUs but none are visible"):
        devices.check_world("nccl", 2)
    gpus(2)
    with pytest.raises(WorldUnavailable, match="world_size=8 exceeds the 2 visible GPUs; pass --world-size 2"):
        devices.check_world("nccl", 8)
    assert devices.check_world("nccl", 2) == [0, 1]
    assert devices.check_world("gloo", 8) is None
