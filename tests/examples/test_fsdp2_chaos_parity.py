"""Chaos inside parity, as PyTorch's own FSDP2 tests do it (``test_fully_shard_training``'s delay
before all-gather, before reduce-scatter and before the optimizer): the equivalence checks on
the FSDP2 port (``examples/train_fsdp2.py``) with one rank delayed at each site stay equal to the
single-process step (issue 40).

The delay is the port's own: its ``parallelize`` gives rank 1's FSDP modules an all-gather or a
reduce-scatter (``set_custom_all_gather`` / ``set_custom_reduce_scatter``: FSDP2's own hooks,
no patch of torch.distributed) that sleeps before issuing the collective, and its
``build_optimizer`` a step pre-hook that sleeps. Each delay is counted (a line per injection in
a file beside the target, per rank): a run whose delays never fired verifies nothing. The
1-rank reference world is never delayed. The whole matrix is slow; CI runs every site at once
on gradient-equivalence (a few seconds).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.harness.registry import BY_ID

from ._variants import variant

SITES = ("all-gather", "reduce-scatter", "optimizer")
DELAY_S = 0.05
DELAYED_RANK = 1

_DELAYED = '''

# -- chaos inside parity: rank {rank} delayed {delay}s before {sites} --------------------------
from pathlib import Path as _Path

import train_fsdp2 as _port
from torch.distributed.fsdp import FSDPModule as _FSDPModule
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultAllGather as _AllGather
from torch.distributed.fsdp._fully_shard._fsdp_collectives import DefaultReduceScatter as _ReduceScatter

_SITES, _RANK, _DELAY_S = {sites!r}, {rank}, {delay}


def _delay(site):
    import time

    with open(_Path(__file__).with_name(f"delays-rank{{dist.get_rank()}}.log"), "a") as log:
        log.write(site + "\\n")
    time.sleep(_DELAY_S)


class _DelayedAllGather(_AllGather):
    def __call__(self, *args, **kwargs):
        _delay("all-gather")
        return super().__call__(*args, **kwargs)


class _DelayedReduceScatter(_ReduceScatter):
    def __call__(self, *args, **kwargs):
        _delay("reduce-scatter")
        return super().__call__(*args, **kwargs)


def _delayed_here():
    return dist.get_world_size() > 1 and dist.get_rank() == _RANK


def parallelize(model, ctx):
    model = _port.parallelize(model, ctx)
    if _delayed_here():
        for module in model.modules():
            if isinstance(module, _FSDPModule):
                if "all-gather" in _SITES:
                    module.set_custom_all_gather(_DelayedAllGather())
                if "reduce-scatter" in _SITES:
                    module.set_custom_reduce_scatter(_DelayedReduceScatter())
    return model


def build_optimizer(params):
    optimizer = _port.build_optimizer(params)
    if "optimizer" in _SITES and _delayed_here():
        optimizer.register_step_pre_hook(lambda *_: _delay("optimizer"))
    return optimizer
'''


def _delayed_port(tmp_path: Path, name: str, sites: tuple[str, ...]) -> str:
    """``train_fsdp2.py`` with the delays appended (its parallelize and build_optimizer wrapped)."""
    path = Path(variant(tmp_path, "train_fsdp2.py", name))
    (path.parent / "train_fsdp2.py").write_text(path.read_text())  # the port, importable as itself
    path = path.with_name("train_fsdp2_delayed.py")
    path.write_text((path.parent / "train_fsdp2.py").read_text()
                    + _DELAYED.format(rank=DELAYED_RANK, delay=DELAY_S, sites=sites))
    return str(path)


def _fired(target: str) -> dict[int, list[str]]:
    folder = Path(target).parent
    return {rank: (folder / f"delays-rank{rank}.log").read_text().split() if
            (folder / f"delays-rank{rank}.log").exists() else [] for rank in (0, 1)}


def _assert_equal_under_delays(record: object, fired: dict[int, list[str]], sites: tuple[str, ...]) -> None:
    status, message = record.status, record.message  # type: ignore[attr-defined]
    assert status == "passed", (status, message)
    assert "fully_shard" in message or "no_sync" in message, message
    # The delays fired on the delayed rank at every site asked for, and nowhere else.
    assert fired[0] == [], fired
    assert {s for s in fired[DELAYED_RANK]} == set(sites), fired


def test_gradient_equivalence_stays_equal_with_every_delay_at_once(suite_session, tmp_path):
    target = _delayed_port(tmp_path, "all_sites", SITES)
    record, _ = suite_session.run_check(BY_ID["gradient-equivalence"], target)
    _assert_equal_under_delays(record, _fired(target), SITES)


@pytest.mark.slow
@pytest.mark.parametrize("check_id", ["gradient-equivalence", "no-sync-equivalence"])
@pytest.mark.parametrize("site", SITES)
def test_equivalence_stays_equal_with_one_rank_delayed(suite_session, tmp_path, check_id, site):
    target = _delayed_port(tmp_path, f"{site}_{check_id}", (site,))
    record, _ = suite_session.run_check(BY_ID[check_id], target)
    _assert_equal_under_delays(record, _fired(target), (site,))
