"""What a check receives: the target, the worlds it may use, and a place to record events.

A check is ``run(ctx: CheckContext) -> Outcome``. Conformance checks use ``ctx.world()``,
the persistent pool (cheap: ~ms per call); chaos checks that hang or kill ranks on purpose
use ``with ctx.fresh_world(...) as world:``, an isolated world torn down afterwards, so a
fault never leaks into the next check.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from ddp_conformance.reports.schema import Event

from .outcome import Outcome
from .registry import CheckSpec
from .targets import TargetInfo
from .world import World, WorldLike


@dataclass
class CheckContext:
    spec: CheckSpec
    target: TargetInfo  # names and settings only: the supervisor never imports the user's code
    backend: str
    world_size: int
    deadline: float
    # True in the default run on the built-in targets: chaos checks then inject their faults
    # into built-in vehicles and pass when the fault is reproduced *and* diagnosed correctly.
    # False with --target: chaos checks examine the user's target as configured.
    injected: bool
    tmpdir: Path
    pool: Callable[..., WorldLike]  # (world_size=None) -> the session's persistent world
    new_world: Callable[..., World] | None  # (**World kwargs) -> a fresh World; None under --attach
    attached: bool = False
    events: list[Event] = field(default_factory=list)
    # The session's memory-backed scratch folder (/dev/shm), None where the host has none:
    # see ``snapshot_folders``.
    memory_dir: Path | None = None
    # The user's interconnect per rank in Gbit/s (--link-gbps), for checks that project onto it.
    link_gbps: float | None = None
    # The suite the run selected (``ci`` | ``full``): the CI subset may run a check on a
    # smaller subject, saying in its record what it left to the full suite.
    suite: str = "full"

    def world(self, world_size: int | None = None) -> WorldLike:
        """The persistent world of this session (``world_size`` ranks; default the run's).

        A 1-rank world is how equivalence checks run the target's own ``train_step`` as the
        single-process reference (under --attach, rank 0 spawns it locally).
        """
        return self.pool(world_size=world_size)

    @contextlib.contextmanager
    def snapshot_folders(self, prefix: str) -> Iterator[tuple[Path, Path | None]]:
        """(folder, memory): where one experiment's reference writes its snapshots, in this
        check's temp dir, and its private folder in the session's memory-backed one (None:
        none here) that the writer fills while the host has room
        (``conformance/checks/equivalence/snapshots.py``). Both are removed when the block ends: the
        snapshots are the model's size several times over."""
        folder = Path(tempfile.mkdtemp(prefix=prefix, dir=self.tmpdir))
        memory = Path(tempfile.mkdtemp(prefix=prefix, dir=self.memory_dir)) if self.memory_dir else None
        try:
            yield folder, memory
        finally:
            shutil.rmtree(folder, ignore_errors=True)
            if memory is not None:
                shutil.rmtree(memory, ignore_errors=True)

    @contextlib.contextmanager
    def fresh_world(self, *, world_size: int | None = None, **kwargs: Any) -> Iterator[WorldLike]:
        """An isolated world for one scenario; always killed afterwards.

        Under --attach there is no supervisor to kill a hung rank, so scenarios that need one
        must check ``ctx.new_world is None`` and skip with that reason.
        """
        if self.new_world is None:
            raise RuntimeError("an isolated world is not available under --attach")
        kwargs.setdefault("deadline", self.deadline)
        world = self.new_world(world_size=world_size or self.world_size, **kwargs)
        try:
            yield world
        finally:
            world.close()

    def record_event(self, name: str, *, t_start: float | None = None, t_end: float | None = None,
                     rank: int | None = None, step: int | None = None, phase: str | None = None,
                     **data: Any) -> Event:
        """Record a fault injection (or another happening) in the result stream."""
        event = Event(name=name, t_start=time.time() if t_start is None else t_start, t_end=t_end,
                      check=self.spec.id, rank=rank, step=step, phase=phase, data=data)
        self.events.append(event)
        return event


#: What a check is: ``run(ctx) -> Outcome``, named in the registry by ``"module:function"``.
CheckEntry = Callable[[CheckContext], Outcome]


def entry_of(spec: CheckSpec) -> CheckEntry:
    """The check's entry, imported now (``CheckSpec.load``): the registry stays import-light."""
    entry: CheckEntry = spec.load()
    return entry
