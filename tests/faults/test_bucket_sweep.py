"""bucket-config's sweep times each bucket layout once: a cap whose rebuilt layout (DDP's own
per-bucket parameter indices) equals an earlier cap's issues the same all-reduces, so it
shares that cap's step times instead of measuring the same step again."""

from __future__ import annotations

import pytest

from conformance.harness.world import World
from ddp_conformance.faults.checks.bucket_config import sweep_rank

from ..conftest import Pace
from . import _bucket_work
from .conftest import fault_target


@pytest.fixture(scope="module")
def world():
    w = World(2, "gloo", deadline=120.0 * Pace().factor)
    yield w
    w.close()


def test_caps_with_one_layout_are_timed_once(world: World) -> None:
    # wide_mlp: 1600x1600 weights (10 MB each): every cap from 0.1 to 5 MB puts each weight
    # and its bias in a bucket of their own, the same 4 buckets; 100 MB puts all in one.
    caps = [0.1, 1.0, 5.0, 100.0]
    results = world.run(sweep_rank, fault_target("wide_mlp"), caps, 30.0)
    for r in results:
        value = r.value
        assert value["same_layout"] == {1.0: 0.1, 5.0: 0.1}
        assert value["times"][1] == value["times"][0] == value["times"][2]
        assert len(value["times"][0]) == len(value["times"][3]) == value["rounds"]
        assert value["times"][3] != value["times"][0]
        assert value["buckets"] == [4, 4, 4, 1]


def test_the_cap_at_a_turn_stays_wrapped(world: World) -> None:
    # Two passes in opposite orders: 0.1, 100 then 100, 0.1. The 100 MB DDP ends the first pass
    # and starts the second, already warm: three wraps, not four, and every cap still gets its
    # rounds of timed steps.
    results = world.run(sweep_rank, fault_target("wide_mlp"), [0.1, 100.0], 30.0)
    for r in results:
        assert r.value["wraps"] == 3
        assert [len(t) for t in r.value["times"]] == [r.value["rounds"]] * 2
        assert r.value["buckets"] == [4, 1]


def test_given_reps_are_the_timed_steps_per_cap(world: World) -> None:
    # The side-by-side re-run of a clear gap repeats the sweep's count instead of sizing its own.
    results = world.run(sweep_rank, fault_target("wide_mlp"), [0.1, 100.0], 30.0, 3)
    for r in results:
        assert r.value["rounds"] == 3
        assert [len(t) for t in r.value["times"]] == [3, 3]


def test_caps_the_sizes_prove_alike_are_never_wrapped(world: World) -> None:
    # No sum of wide_mlp's parameters lies between 0.1 and 5 MB: 1 and 5 MB are known to be
    # 0.1 MB's layout before any step. Two points: 0.1 and 100 MB wrapped in the first pass, 0.1
    # again in the second (100 MB stays wrapped across the turn), two warm-up steps per wrap.
    results = world.run(sweep_rank, fault_target("wide_mlp"), [0.1, 1.0, 5.0, 100.0], 30.0)
    for r in results:
        value = r.value
        assert value["proved_same"] == [1.0, 5.0]
        assert value["wraps"] == 3
        assert value["steps"] == 3 * 2 + 2 * value["rounds"]
        assert value["buckets"] == [4, 4, 4, 1]


@pytest.mark.parametrize("name", ["wide_mlp", "tiny_buckets"])
def test_caps_proved_alike_have_ddps_same_layout(world: World, name: str) -> None:
    # The proof against DDP itself: every cap it merges, wrapped and stepped, logs the layout of
    # the cap it was merged into.
    from ddp_conformance.faults.checks._bucket_plan import param_bytes, provably_same_layout
    from conformance.harness.targets import load_target

    spec = fault_target(name)
    caps = [0.001, 0.01, 0.1, 1.0, 5.0, 25.0, 100.0, 1000.0]
    merged = provably_same_layout(param_bytes(load_target(spec).build_model().parameters()), caps)
    assert merged  # both models have caps that merge (tiny_buckets: 1 MB and up hold it all)
    layouts = world.run(_bucket_work.ddp_layouts, spec, caps)[0].value
    assert all(layouts)
    for i, j in merged.items():
        assert layouts[i] == layouts[j], (caps[i], caps[j])


def test_the_configured_cap_ends_the_first_pass_and_stays_wrapped(world: World) -> None:
    # With the configured cap named (focus), its point is visited last in the first pass, so it
    # is the turn's: its second share follows without a wrap. 100 MB is timed again only if, in
    # the first pass, it could be more than PENALTY_LIMIT faster than 0.1 MB.
    results = world.run(sweep_rank, fault_target("wide_mlp"), [0.1, 100.0], 30.0, focus=0.1)
    for r in results:
        value = r.value
        rounds, first = value["rounds"], -(-value["rounds"] // 2)
        assert len(value["times"][0]) == rounds
        assert len(value["times"][1]) in (first, rounds)
        assert value["wraps"] == 2 + (len(value["times"][1]) == rounds)
    assert results[0].value["times"][1] != [] and len(results[0].value["times"][1]) == len(results[1].value["times"][1])


def test_the_sweep_says_where_its_time_went(world: World) -> None:
    # Per rank, the seconds spent in untimed warm-up steps, in timed steps and the rest (wraps,
    # dropped DDPs): the timed phase is exactly the step times the curve is made of.
    caps = [0.1, 1.0, 100.0]
    results = world.run(sweep_rank, fault_target("wide_mlp"), caps, 30.0)
    for r in results:
        value = r.value
        phases = value["phases_s"]
        assert set(phases) == {"warmup", "timed", "other"}
        # 1 MB shares 0.1 MB's times (the same layout), measured once
        timed = sum(sum(t) for cap, t in zip(caps, value["times"]) if cap not in value["same_layout"])
        assert phases["timed"] == pytest.approx(timed, rel=1e-9)
        assert phases["warmup"] > 0 and phases["other"] > 0


def test_a_dropped_ddp_is_collected_only_when_a_cycle_holds_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # A full collection in a rank costs 0.3-0.5 s at 34 M (every object torch made is walked),
    # so it runs only when reference counting left the dropped model alive: held by a cycle.
    import gc
    import weakref

    import torch
    from torch import nn

    from ddp_conformance.faults.checks import bucket_config

    collected: list[int] = []
    real = gc.collect
    monkeypatch.setattr(gc, "collect", lambda *a: collected.append(1) or real(*a))
    module = nn.Linear(4, 4)
    module(torch.ones(1, 4)).sum().backward()  # a gradient left on the module, as a step leaves
    free = nn.Sequential(module)
    ref = weakref.ref(free)
    gone = bucket_config._dropping(module, free)
    del free
    gone()
    assert ref() is None and collected == [] and module.weight.grad is None
    cyclic = nn.Sequential(module)
    cyclic.me = [cyclic]  # type: ignore[assignment]  # a reference cycle, as a configure_ddp may make
    ref = weakref.ref(cyclic)
    gone = bucket_config._dropping(module, cyclic)
    del cyclic
    gone()
    assert ref() is None and collected == [1]
