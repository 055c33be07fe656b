"""benchmarks/model_scale.py's own arithmetic: what decides whether a size runs, and the
per-rank figure it prints (the benchmark itself is run by hand)."""

from __future__ import annotations

from types import ModuleType

import pytest

from ._benchmarks import load

MIB, GIB = 1 << 20, 1 << 30


@pytest.fixture(scope="module")
def scale() -> ModuleType:
    return load("model_scale")


def test_100m_runs_on_a_24_gb_host_after_2m(scale: ModuleType) -> None:
    """100 M parameters (400 MB): its training on 2 ranks and the reference needs ~6 GB, so it
    runs on this 24 GB host whatever 2 M measured. (It was skipped after 2 M: a projection
    through the small size's tree peak predicted 31 GiB, then 57 GiB.)"""
    need = scale.training_need(400_000_000)
    assert 4 * GIB < need < 8 * GIB
    assert not hasattr(scale, "DEFAULT_TREE_COPIES") and not hasattr(scale, "projected_tree")


def test_a_size_the_host_cannot_train_is_skipped(scale: ModuleType) -> None:
    assert scale.training_need(4_000_000_000) > 24 * GIB  # 1 B parameters: projected, not run


def test_the_guard_stops_a_size_when_memory_runs_low(scale: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    import conformance.harness.resources as resources

    class Session:
        closed = 0

        def close(self) -> None:
            self.closed += 1

    session = Session()
    monkeypatch.setattr(resources, "available_memory", lambda: GIB)
    with scale.MemoryGuard(session, "100M") as guard:
        guard._thread.join(timeout=5)
    assert guard.tripped and session.closed == 1


def test_the_per_rank_figure_is_the_largest_process_over_the_baseline(scale: ModuleType) -> None:
    base = scale.Baseline(rss=300 * MIB, step_rss=400 * MIB, step_cuda=None, labels={11: "rank 0", 12: "reference"})
    ratio, who = scale.rank_memory({"11": 700 * MIB, "12": 820 * MIB, "13": 310 * MIB}, base)
    assert (ratio, who) == (pytest.approx(1.3), "reference")
    assert scale.rank_memory({"99": 800 * MIB}, base)[1] == "pid 99"


def test_the_1b_projection_needs_a_model_dominated_size(scale: ModuleType) -> None:
    def row(size: str, model_bytes: int, step_rss: int) -> object:
        return scale.Row(size, model_bytes // 4, model_bytes, 1.0, "gradient-equivalence", "passed", 6.0,
                         200 * MIB, 2 * GIB, 1.2, "reference", None, step_rss)

    big = [line for line in scale.summary([row("100M", 400 * MIB, 1200 * MIB)], "100M", "100M")
           if line.startswith("projection_1B")]
    assert big and "~13.4 GiB" in big[0]  # 3 copies x 4e9 bytes x 1.2 = 13.4 GiB
    small = [line for line in scale.summary([row("0.1M", 400_000, 25 * MIB)], "0.1M", "0.1M")
             if line.startswith("projection_1B")]
    assert small and small[0].startswith("projection_1B: n/a")
