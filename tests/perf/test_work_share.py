"""benchmarks/work_share.py: which sampled stacks are a check's own training work, and how a
check's work is summed over its processes (the sampler itself is run by
``benchmarks/model_scale.py --work``)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

from ._benchmarks import load

RANK = "<string>:<module>;_zygote.py:zygote_main;_rank.py:rank_main"
STEP = f"{RANK};recording.py:run_recorded;calls.py:run_step;calls.py:accumulate_step"


@pytest.fixture(scope="module")
def share() -> ModuleType:
    return load("work_share")


def test_the_targets_step_is_work_and_the_suites_instruments_inside_it_are_not(share: ModuleType,
                                                                             tmp_path: Path) -> None:
    (tmp_path / "101.txt").write_text("\n".join([
        f"3000000 {STEP};_tensor.py:backward;graph.py:_engine_run_backward",  # the target's backward: work
        f"1000000 {STEP};optimizer.py:wrapper;instruments.py:pre_step;snapshots.py:compare_snapshot",  # instrument
        f"500000 {RANK};rank_run.py:build;mlp.py:build_model",  # the model's build: overhead
        f"9000000 {RANK};connection.py:recv_bytes;connection.py:_recv",  # waiting for a call: not busy
        "7000000 <string>:<module>;_zygote.py:zygote_main;forkserver.py:main",  # no rank_main: not a rank's
    ]) + "\n")
    assert share.read(tmp_path) == {101: Counter(busy=4_500_000, work=3_000_000)}


def test_a_checks_work_is_the_reference_s_plus_the_ranks_per_rank(share: ModuleType) -> None:
    """The reference runs alone, then the ranks at once: 2 s + (3 s + 3 s) / 2 = 5 s; what a
    process had done before the check (``before``) is not the check's."""
    before = {1: Counter(work=1_000_000), 2: Counter(work=1_000_000), 9: Counter(work=500_000)}
    after = {1: Counter(work=4_000_000), 2: Counter(work=4_000_000), 9: Counter(work=2_500_000)}
    assert share.work_seconds(before, after, reference={9}, world_size=2) == pytest.approx(5.0)
    # A fresh world's ranks (pids new since ``before``) count whole, per rank, as well.
    after[30], after[31] = Counter(work=2_000_000), Counter(work=2_000_000)
    assert share.work_seconds(before, after, reference={9}, world_size=2) == pytest.approx(7.0)
