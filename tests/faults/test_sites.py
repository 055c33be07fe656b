"""Each fault owns its effect: offered a site, it acts only where its schedule and its kind of
site say, records one Injection there, and pulls the site's lever (or strikes the process).
The record converts to the report's Event and back without loss."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from ddp_conformance.faults import (
    PHASES,
    SITE_KINDS,
    BucketConfig,
    ConditionalBranch,
    DeadRank,
    Injection,
    InjectionLog,
    Site,
    SkipCollective,
    SlowRank,
    StalledRank,
    UnevenBatches,
)
from ddp_conformance.faults import injectors as injectors_module
from ddp_conformance.faults import read_injections, record_injections
from ddp_conformance.faults.scenarios import Scenario
from ddp_conformance.faults.sites import NO_FAULT, faulted_step
from ddp_conformance.reports.schema import Event

ROOT = Path(__file__).resolve().parents[2]


def _sites(rank: int, step: int) -> list[Site]:
    """Every kind of site at every phase, for one (rank, step)."""
    return [Site(kind, rank, step, phase, tensor=torch.zeros(8)) for kind in SITE_KINDS for phase in PHASES]


@pytest.mark.parametrize(("fault", "kind", "ranks", "step", "phase"), [
    (ConditionalBranch(ranks=(1,), steps=(2,)), "branch", [1], 2, "forward"),
    (SlowRank(rank=1, phase="backward", delay_s=0.001), "step", [1], 0, "backward"),
    (BucketConfig(per_rank=(0.01, 25.0)), "wrap", [0, 1], 0, "data"),  # every rank gets its own cap
    (SkipCollective(rank=1, step=2), "collective", [1], 2, "backward"),
    (StalledRank(rank=1, step=2), "collective", [1], 2, "backward"),
    (UnevenBatches(rank=1, batches=2), "step", [1], 2, "data"),
])
def test_a_fault_acts_only_at_its_kind_of_site_where_its_schedule_fires(
        fault: Any, kind: str, ranks: list[int], step: int, phase: str) -> None:
    fired = [(s.kind, s.rank, s.step, s.phase) for r in (0, 1) for s in _sites(r, step) if fault.inject(s)]
    assert fired == [(kind, rank, step, phase) for rank in ranks]
    assert not NO_FAULT.inject(Site(kind, ranks[0], step, phase, tensor=torch.zeros(8)))


def test_each_fault_records_itself_and_pulls_its_lever(monkeypatch: pytest.MonkeyPatch) -> None:
    branch = Site("branch", 1, 2, "forward", label="aux_head")
    assert ConditionalBranch(ranks=(1,), steps=(2,)).inject(branch) and branch.taken
    assert branch.log.items[0].data == {"branch": "aux_head"}

    skipped = Site("collective", 1, 1, "backward", label="step1", tensor=torch.zeros(8))
    assert SkipCollective(rank=1, step=1).inject(skipped) and skipped.skip
    assert skipped.log.items[0].data == {"skipped": "step1"}

    reshaped = Site("collective", 1, 1, "backward", label="step1", tensor=torch.zeros(8))
    assert SkipCollective(rank=1, step=1, shape_mismatch=True).inject(reshaped) and not reshaped.skip
    assert reshaped.tensor.shape == (16,) and reshaped.log.items[0].data == {"shape": [16]}

    short = Site("step", 1, 2, "data")
    assert UnevenBatches(rank=1, batches=2).inject(short) and short.exhausted
    assert short.log.items[0].data == {"batches": 2}

    wrap = Site("wrap", 0, 0, "data", ddp_kwargs={"bucket_cap_mb": 25.0, "find_unused_parameters": True})
    assert BucketConfig(per_rank=(0.01, 25.0)).inject(wrap) and wrap.ddp_kwargs["bucket_cap_mb"] == 0.01
    assert wrap.log.items[0].data == {"bucket_cap_mb": 0.01, "find_unused_parameters": True}
    assert not BucketConfig(per_rank=(5.0, 5.0)).inject(Site("wrap", 0, 0, "data"))  # nothing differs

    slow = Site("step", 1, 3, "forward")
    start = time.time()
    assert SlowRank(rank=1, phase="forward", delay_s=0.02).inject(slow)
    (record,) = slow.log.items
    assert record.t_end - record.t_start >= 0.02 and record.t_start >= start and record.data == {"delay_s": 0.02}

    # The stall is deferred to the moment the collective is handed over; freeze() is replaced
    # here (the real one is shown stopping a process in test_injectors.py).
    frozen: list[int] = []
    monkeypatch.setattr(injectors_module, "freeze", lambda: frozen.append(1))
    stalled = Site("collective", 1, 1, "backward", label="step1", tensor=torch.zeros(8))
    assert StalledRank(rank=1, step=1).inject(stalled) and not stalled.log.items and not frozen
    assert stalled.on_issue is not None
    stalled.on_issue()
    assert frozen == [1] and stalled.log.items[0].data["stalled"] == "step1"


@pytest.mark.parametrize(("how", "code"), [("exit", 1), ("kill", -9)])
def test_dead_rank_ends_the_process_with_its_record_already_on_file(tmp_path: Path, how: str, code: int) -> None:
    program = (f"from faults import DeadRank, InjectionLog, Site\n"
               f"log = InjectionLog(directory={str(tmp_path)!r}, rank=1)\n"
               f"DeadRank(rank=1, step=2, phase='forward', how={how!r}).inject(Site('step', 1, 2, 'forward', log))\n"
               f"print('still alive')\n")
    proc = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == code and "still alive" not in proc.stdout, proc.stderr
    (record,) = read_injections(tmp_path, 1)
    assert (record.name, record.rank, record.step, record.phase, record.data) == \
        ("dead-rank", 1, 2, "forward", {"how": how})


def test_sites_reject_an_unknown_kind_or_phase() -> None:
    with pytest.raises(ValueError, match="site kind='loop' is not one of step, collective, branch, wrap"):
        Site("loop", 0, 0, "data")
    with pytest.raises(ValueError, match="phase='allreduce' is not one of data, forward, backward, optimizer"):
        Site("step", 0, 0, "allreduce")


def test_a_run_loop_scenario_refuses_a_fault_it_could_never_inject() -> None:
    with pytest.raises(ValueError, match="offers no injection site; inject dead-rank into a 'ddp'"):
        Scenario("x", "run_loop", "target.py", DeadRank(rank=1))


class _Recorder:
    """A fault that fires everywhere and writes down each site, with what it saw there."""

    name = "recorder"

    def __init__(self, model: torch.nn.Module, stop_at: int | None = None) -> None:
        self.model, self.stop_at, self.seen = model, stop_at, []  # type: ignore[var-annotated]

    def fires(self, rank: int, step: int, phase: str) -> bool:
        return True

    def inject(self, site: Site) -> bool:
        grads = any(p.grad is not None for p in self.model.parameters())
        self.seen.append((site.kind, site.phase, grads))
        site.exhausted = site.phase == "data" and site.step == self.stop_at
        return True


def test_faulted_step_offers_every_phase_and_backward_before_any_gradient() -> None:
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    fault = _Recorder(model, stop_at=1)
    drawn: list[int] = []

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        drawn.append(1)
        return torch.ones(3, 4), torch.zeros(3, 2)

    def loss(m: Any, x: Any, y: Any) -> Any:
        return torch.nn.functional.mse_loss(m(x), y)

    kw: dict[str, Any] = {"rank": 0, "log": InjectionLog(), "device": None, "model": model,
                          "optimizer": optimizer, "compute_loss": loss, "batch": batch}
    assert faulted_step(fault, step=0, **kw)
    # zero_grad(set_to_none) ran before "forward"; "backward" runs before any gradient exists
    assert fault.seen == [("step", "data", False), ("step", "forward", False), ("step", "backward", False),
                          ("step", "optimizer", True)]
    assert not faulted_step(fault, step=1, **kw)  # the data ran out: no batch drawn, no step taken
    assert len(drawn) == 1 and fault.seen[-1] == ("step", "data", True)


def test_an_injection_travels_to_the_report_as_an_event_without_loss(tmp_path: Path) -> None:
    log = InjectionLog(directory=tmp_path, rank=1)
    log.mark(SkipCollective(rank=1), 1, 1, "backward", skipped="step1")
    (made,) = log.items
    event = made.to_event(check="hang-detection")
    assert (event.name, event.rank, event.step, event.phase, event.t_start, event.t_end, event.data) == \
        (made.name, made.rank, made.step, made.phase, made.t_start, made.t_end, made.data)
    assert Injection.from_event(Event.from_json(event.to_json())) == made
    assert read_injections(tmp_path, 1) == [made]  # the file holds the same Event JSON
    ctx = SimpleNamespace(spec=SimpleNamespace(id="hang-detection"), events=[])
    assert record_injections(ctx, log.items) == 1  # type: ignore[arg-type]
    assert ctx.events == [event]
    with pytest.raises(ValueError, match="lacks the rank, step, phase or t_end of an injection"):
        Injection.from_event(Event(name="note", t_start=0.0))
