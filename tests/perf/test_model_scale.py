"""benchmarks/model_scale.py's own arithmetic: the memory projection that decides whether a
size runs, and the per-rank figure it prints (the benchmark itself is run by hand)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

MIB, GIB = 1 << 20, 1 << 30


@pytest.fixture(scope="module")
def scale() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "model_scale.py"
    spec = importlib.util.spec_from_file_location("model_scale_under_test", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def test_one_size_measured_projects_from_its_own_copies_not_a_stale_slope(scale: ModuleType) -> None:
    """After 2M alone (the tree 1.75 GiB at its peak, 1.55 GiB of it torch in every process),
    100M (400 MB) is projected from the 2M run's own copies of the model: it fits a 22 GiB host.
    (It was projected with a fixed 65 copies: 31 GiB, and 100M was skipped.)"""
    two_m = 4 * 2_000_000
    seen = [(two_m, int(1.75 * GIB), int(1.55 * GIB))]
    slope = scale.tree_slope(seen)
    assert slope == pytest.approx((0.2 * GIB) / two_m, rel=1e-6)
    need = scale.projected_tree(seen, 400_000_000)
    assert need < 22 * GIB
    assert need == int((1.75 * GIB + slope * (400_000_000 - two_m)) * scale.HEADROOM)


def test_two_sizes_project_along_their_line(scale: ModuleType) -> None:
    seen = [(100 * MIB, 2 * GIB, GIB), (200 * MIB, 3 * GIB, GIB)]
    assert scale.tree_slope(seen) == pytest.approx(10.24)
    assert scale.projected_tree([], 400 * MIB) == 0  # nothing ran: nothing to project from


def test_the_per_rank_figure_is_the_largest_process_over_the_baseline(scale: ModuleType) -> None:
    base = scale.Baseline(rss=300 * MIB, step_rss=400 * MIB, step_cuda=None, labels={11: "rank 0", 12: "reference"})
    ratio, who = scale.rank_memory({"11": 700 * MIB, "12": 820 * MIB, "13": 310 * MIB}, base)
    assert (ratio, who) == (pytest.approx(1.3), "reference")
    assert scale.rank_memory({"99": 800 * MIB}, base)[1] == "pid 99"
