"""bucket-config's reproduction of a bucket_cap_mb that differs across ranks: the mismatched run
and the matched one it is compared with start from the same state, broadcast once; it runs and
is judged in the built-in (injected) run only, never per target (torch's behaviour, not the
model's), and a target's record says so."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from conformance.harness.context import CheckContext
from conformance.harness.world import World
from ddp_conformance.faults.checks import bucket_config
from ddp_conformance.faults.checks.bucket_config import mismatch_rank
from ddp_conformance.faults.injectors import BucketConfig

from ..conftest import Pace
from . import _bucket_work
from .conftest import fault_target


@pytest.fixture(scope="module")
def world():
    w = World(2, "gloo", deadline=120.0 * Pace().factor)
    yield w
    w.close()


@pytest.mark.parametrize("seed_per_rank", [False, True])
def test_the_matched_run_restarts_from_the_broadcast_start(world: World, tmp_path, seed_per_rank: bool) -> None:
    # The matched run restarts from the state kept after the mismatched run's wrap broadcast
    # rank 0's model, so it wraps without a second broadcast (a copy of the model over the
    # network: 381 MiB at 100 M parameters) and still starts where the mismatched run did, even
    # when the ranks built different models (seeded apart): the two runs train identically.
    config = BucketConfig(per_rank=(0.01, 25.0))
    results = world.run(_bucket_work.counting_init_syncs, seed_per_rank, mismatch_rank,
                        fault_target("wide_mlp"), config, False, str(tmp_path))
    for r in results:
        syncs, value = r.value
        assert syncs == 1
        assert value["max_diff"] == 0.0
        assert set(value["phases_s"]) == {"build_and_wrap", "mismatched_run", "matched_run"}


def _stub_ctx(tmp_path: Path, *, injected: bool, spawned: list[dict[str, Any]]) -> Any:
    """A context whose fresh worlds are only counted (a spawn raises: nothing may run in one),
    spawned by the harness's own rule, for a target configured with find_unused_parameters=True
    (the setting a mismatch aborts) or, injected, for the built-in vehicle."""

    def new_world(**kwargs: Any) -> Any:
        spawned.append(kwargs)
        raise AssertionError(f"a fresh world was started: {kwargs}")

    ctx = SimpleNamespace(world_size=2, injected=injected, new_world=new_world, deadline=60.0, tmpdir=str(tmp_path),
                          world=lambda: None, target=SimpleNamespace(
                              spec="t.py", ddp_kwargs={"bucket_cap_mb": 25.0, "find_unused_parameters": True},
                              has=lambda name: False))
    ctx.fresh_world = lambda **kw: CheckContext.fresh_world(ctx, **kw)  # type: ignore[arg-type]
    return ctx


def _passing_sweep(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """A sweep the configured 25 MB cap passes (x1.05 of the fastest), with the injected
    judge's cliff (0.01 MB: 24 buckets against 1)."""
    return {"configured": 25.0, "best": 1.0, "penalty": 1.05, "clear_gap": False, "rounds": 3,
            "warmup_step_s": 0.01, "steps": 9, "buckets_reduced": {0: 1, 1: 1},
            "sweep": [{"bucket_cap_mb": 0.01, "buckets": 24, "step_time_s": 0.030},
                      {"bucket_cap_mb": 1.0, "buckets": 6, "step_time_s": 0.010},
                      {"bucket_cap_mb": 25.0, "buckets": 1, "step_time_s": 0.0105}]}


def test_a_target_run_starts_no_mismatch_world_and_says_where_the_mismatch_is_judged(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # What caps differing across ranks do is torch's DDP (rank 0's rebuilt layout adopted), not
    # the target's model: its reproduction was a fresh world and two trainings of the user's
    # model per target run (~7.6 of 100 M parameters' bare steps), judged by nothing.
    spawned: list[dict[str, Any]] = []
    monkeypatch.setattr(bucket_config, "sweep", _passing_sweep)
    outcome = bucket_config.run(_stub_ctx(tmp_path, injected=False, spawned=spawned))
    assert outcome.status == "passed", outcome.message
    assert spawned == []
    assert outcome.evidence == {"mismatched_config_note": bucket_config.MISMATCH_NOTE}
    assert "ddp-conformance run --checks bucket-config" in bucket_config.MISMATCH_NOTE
    assert "mismatch" not in outcome.metrics["phases_s"]


def test_the_built_in_run_still_reproduces_the_mismatch_both_ways_and_judges_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # End to end in a real world: test_chaos_checks.py::test_bucket_config_sweep_and_mismatch.
    asked: list[tuple[bool, ...]] = []

    def reproduce(ctx: Any, source: Any, options: tuple[bool, ...]) -> list[dict[str, Any]]:
        asked.append(options)
        return [{"per_rank_bucket_cap_mb": [0.01, 25.0], "find_unused_parameters": fu, "fired": 2,
                 "outcome": "trained", "max_diff_vs_matched": 0.0} for fu in options]

    monkeypatch.setattr(bucket_config, "sweep", _passing_sweep)
    monkeypatch.setattr(bucket_config, "reproduce_mismatch", reproduce)
    outcome = bucket_config.run(_stub_ctx(tmp_path, injected=True, spawned=[]))
    assert asked == [(False, True)]
    assert [m["find_unused_parameters"] for m in outcome.evidence["mismatched_config"]] == [False, True]
    # find_unused_parameters=True trained instead of aborting: the judge says so.
    assert outcome.status == "failed", outcome.message
    assert "mismatched caps with find_unused_parameters=True should abort; got trained" in outcome.message
