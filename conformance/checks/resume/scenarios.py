"""The supervisor side of the experiment: the lives run in fresh worlds, the kill points chosen
from the uninterrupted run, and the journals read back.

Each life runs in a world of its own (``CheckContext.fresh_world``): a restart is a new set of
processes and a new process group, as after torchrun's agent restarts the workers. A killed
life ends in ``RankFailure`` (its ranks died by SIGKILL at the planned point); the world's own
kill path then reaps every process, DataLoader workers included, and removes its temp folder.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ...harness.world import RankFailure
from .life import live
from .records import (
    KILLED_BETWEEN,
    KILLED_DURING_SAVE,
    UNINTERRUPTED,
    KillPlan,
    Life,
    in_place_copy,
    journal_path,
    read_journal,
    stopped_at,
    stopped_in_save,
)


T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Run:
    """One scenario: its lives (per life, per rank) and the kill that separated them."""

    scenario: str
    plan: KillPlan
    lives: list[list[Life]]  # [life 1, life 2], each in rank order; one life when uninterrupted
    failure: RankFailure | None = None  # how life 1 ended in the supervisor's eyes (killed: expected)
    kill_fired: bool = True  # the planned kill was carried out (a journal says "killed")
    #: life 1 is the uninterrupted run up to the kill point, its checkpoint folder copied there
    #: (``Lives.from_copy``), not a world of its own SIGKILLed
    copied: bool = False

    @property
    def first(self) -> list[Life]:
        return self.lives[0]

    @property
    def restart(self) -> list[Life]:
        return self.lives[-1]


def files_in(folder: Path) -> list[str]:
    return sorted(str(Path(root, f).relative_to(folder)) for root, _, names in os.walk(folder) for f in names)


def worlds_ahead(world_size: int) -> int:
    """How many worlds may start while one life runs: a rank's start is about one core busy
    importing torch, so as many as the cores allow beside the running world (at least one)."""
    return max(1, (os.cpu_count() or 1) // (2 * world_size) - 1)


class Lives:
    """Runs lives of the target's loop; ``world()`` gives a fresh world (a context manager).

    A restart's floor is a world's start (fresh interpreters, the torch import, the process
    group): while one life runs, the worlds for the next ones are launched (``World.launch``:
    spawned, not waited for; ``ahead`` at most), so their starts overlap the loop instead of
    following it. Both the launches and the closing of a world whose life is over run on
    threads of their own, off the lives' path (a launch is a tenth of a second of the
    supervisor's, a close as much of waiting for the ranks to leave).
    """

    def __init__(self, world: Callable[[], Any], target_spec: str, folder: Path, steps: int, every: int,
                 deadline: float, *, ahead: int = 1) -> None:
        self.world, self.spec, self.folder = world, target_spec, folder
        self.steps, self.every, self.deadline = steps, every, deadline
        self.ahead = ahead
        self._stack = contextlib.ExitStack()
        self._spares: list[Any] = []
        self._lock = threading.Lock()  # the spares and the stack: lives and launches on several threads
        self._closing = False
        self._behind: list[threading.Thread] = []

    def __enter__(self) -> Lives:
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._closing = True  # a launch still under way ends first; none starts after it
        for thread in self._behind:
            thread.join()  # closes (within the world's close grace) and launches
        self._stack.close()  # spares launched for lives that did not come, and any still running

    def checkpoints(self, scenario: str) -> Path:
        path = self.folder / f"{scenario}-checkpoints"
        path.mkdir(exist_ok=True)
        return path

    def _take(self, more: int, given: Any = None) -> Any:
        """The world for this life (``given``, else a spare when one was launched); spares for up
        to ``more`` lives that follow are launched behind it."""
        # This life's world is launched first: it takes the warm zygote (world/_zygote.py) when
        # there is one, and the spares launched next start behind it, not ahead of it.
        with self._lock:
            taken = given if given is not None else self._spares.pop(0) if self._spares else self._launched()
        if more:
            self._in_background(lambda: self.launch(min(more, self.ahead), added=True))
        return taken

    def _launched(self) -> Any:
        if self._closing:
            raise RuntimeError("no world is launched once the lives are over")
        world = self._stack.enter_context(_Deferred(self.world()))
        launch = getattr(world, "launch", None)
        if launch is not None:
            launch()
        return world

    def _in_background(self, work: Callable[[], Any]) -> None:
        """``work`` on a thread of its own (joined at the end). What fails there is not lost: a
        spare that did not launch is launched again by the life that needs it, and a world
        that did not close is killed with the stack."""
        def run() -> None:
            with contextlib.suppress(Exception):
                work()

        thread = threading.Thread(target=run, name="resume-behind", daemon=True)
        self._behind.append(thread)
        thread.start()

    def launch(self, worlds: int, *, added: bool = False) -> None:
        """Launch spares now: up to ``worlds`` in all, or ``worlds`` more (``added``: a life's own
        successors, when lives run side by side)."""
        with self._lock:
            for _ in range(worlds if added else max(0, worlds - len(self._spares))):
                self._spares.append(self._launched())

    def side_by_side(self, scenarios: dict[str, Callable[[], T]]) -> dict[str, T]:
        """Each scenario's lives (``scenarios``: name -> what runs them), the scenarios side by
        side: they share nothing but the worlds' launcher (each its own checkpoint folder and
        journals), and a life is partly waiting (process starts, collectives, kills), so on
        spare or idle cores they overlap. The last runs on this thread, the others on their
        own; a WorldHang (or any error) of one is raised here once all have ended, and an
        interrupt here kills every world first, so no thread is left waiting on one."""
        names = list(scenarios)
        done: dict[str, T] = {}
        errors: dict[str, BaseException] = {}

        def run(name: str) -> None:
            try:
                done[name] = scenarios[name]()
            except BaseException as exc:  # noqa: BLE001 - raised on the caller's thread below
                errors[name] = exc

        threads = [threading.Thread(target=run, args=(name,), name=f"resume-{name}", daemon=True)
                   for name in names[:-1]]
        for thread in threads:
            thread.start()
        try:
            run(names[-1])
        finally:
            if isinstance(errors.get(names[-1]), (KeyboardInterrupt, SystemExit)):
                self._stack.close()  # every world killed: the other threads' calls end at once
            for thread in threads:
                thread.join()
        for name in names:
            if name in errors:
                raise errors[name]
        return done

    def copy(self, kind: str = "after-step", *, in_place: bool = False) -> Path:
        """Where the uninterrupted life copies its checkpoint folder at a kill point: between
        steps (``after-step``) or half-way through a save (``during-save``: the round's first,
        or ``in_place``, its first over a file of an earlier round)."""
        copy = self.folder / f"{KILLED_BETWEEN if kind == 'after-step' else KILLED_DURING_SAVE}-copy"
        return in_place_copy(copy) if in_place else copy

    def one(self, scenario: str, life: int, plan: KillPlan, size: int, *, more: int = 0, copy: bool = False,
            checkpoints: Path | None = None, world: Any = None) -> tuple[list[Life], RankFailure | None]:
        """Life ``life`` of ``scenario``: the journals, and the RankFailure it ended in (None:
        every rank returned). A hang or another failure propagates to the caller. ``more``:
        how many lives follow (their worlds are launched now); ``copy``: the checkpoint folder
        copied at the between-steps kill point (``copy()``, ``from_copy``); ``checkpoints``: the
        folder (default: the scenario's own)."""
        failure = None
        folder = checkpoints or self.checkpoints(scenario)
        world = self._take(more, world)
        try:
            world.run(live, self.spec, folder=str(self.folder), checkpoints=str(folder),
                      scenario=scenario, life=life, plan=plan, steps=self.steps, every=self.every,
                      copy_to=str(self.copy()) if copy else None,
                      copy_in_save=(during_save_guess(self.every), str(self.copy("during-save"))) if copy else None,
                      deadline=self.deadline)
        except RankFailure as exc:
            failure = exc  # its ranks are dead (killed as planned, or by the world on a failure)
        except BaseException:
            world.close()
            raise
        # Every rank returned (its journal closed) or is dead: the world is closed, and its ranks
        # leave, while the next life runs.
        self._in_background(world.close)
        return [read_journal(journal_path(self.folder, scenario, life, r), r) for r in range(size)], failure

    def killed(self, scenario: str, plan: KillPlan, size: int, *, more: int = 0) -> Run:
        """Life 1 killed as planned, then life 2 on the same checkpoint folder; ``more``: how
        many lives follow these two."""
        first, failure = self.one(scenario, 1, plan, size, more=more + 1)
        return self.restarted(scenario, plan, first, failure, size, more=more)

    def restarted(self, scenario: str, plan: KillPlan, first: list[Life], failure: RankFailure | None, size: int,
                  *, more: int = 0) -> Run:
        """Life 1's journals (``first``) and, when its kill fired, life 2 on the same folder."""
        fired = any(life.ended == "killed" for life in first)
        if not fired:
            # The kill point was never reached (the loop took another path this time): the
            # restart would compare nothing that was interrupted.
            return Run(scenario, plan, [first], failure, kill_fired=False)
        second, failure2 = self.one(scenario, 2, KillPlan("none"), size, more=more)
        return Run(scenario, plan, [first, second], failure2)

    def from_copy(self, uninterrupted: list[Life], plan: KillPlan, size: int, *, more: int = 0) -> Run:
        """A kill scenario with the uninterrupted run as its life 1, stopped at the kill point
        where its checkpoint folder was copied (``plan``: between steps, ``life.Steps._copy_here``;
        during a save, ``observers.Saves._torn_copy``; each says why the copy is what the kill
        leaves), then life 2 in a fresh world on that copy, under the very path life 1 wrote to
        (a checkpoint that names its own folder, a ``latest`` symlink, finds it as after a real
        kill). Restarts from copies therefore run one after the other."""
        between = plan.kind == "after-step"
        scenario = KILLED_BETWEEN if between else KILLED_DURING_SAVE
        first = [stopped_at(life, plan.step) if between else stopped_in_save(life, plan) for life in uninterrupted]
        path = self.checkpoints(UNINTERRUPTED)
        os.replace(path, self.folder / f"{UNINTERRUPTED}-checkpoints-before-{scenario}")
        os.replace(self.copy(plan.kind, in_place=bool(plan.path)), path)
        second, failure = self.one(scenario, 2, KillPlan("none"), size, more=more, checkpoints=path)
        return Run(scenario, plan, [first, second], failure, copied=True)


class _Deferred:
    """A world context entered on the lives' stack (closed at the end if never used)."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager

    def __enter__(self) -> Any:
        return self.manager.__enter__()

    def __exit__(self, *exc: Any) -> Any:
        return self.manager.__exit__(*exc)


def copied_at(uninterrupted: list[Life], plan: KillPlan | str) -> bool:
    """The uninterrupted life copied its checkpoint folder at ``plan``'s kill point (the copying
    rank journals it; ``from_copy`` can stand in for a killed first life): between steps, rank
    0 after that step; during a save, the victim half-way through it, with no peer saving there
    (the copy's point is ``during_save_guess``, fixed before the run that plans the kill)."""
    if not isinstance(plan, KillPlan) or not uninterrupted:
        return False
    if plan.kind == "after-step":
        return uninterrupted[0].copied == plan.step
    if plan.kind != "during-save" or plan.peers or plan.rank >= len(uninterrupted):
        return False
    life = uninterrupted[plan.rank]
    return (life.copied_in_place if plan.path else life.copied_in_save) == plan.step


def between_steps_plan(uninterrupted: list[Life]) -> KillPlan | str:
    """Kill after the first step whose listing shows a checkpoint on every rank: the save
    before it is complete (rename included) and the loop went on for one more step. A reason
    (str) when there is no such step before the last one."""
    first = []
    for life in uninterrupted:
        seen = next((s.index for s in life.steps if s.files), None)
        if seen is None:
            return "no checkpoint appeared in ctx.checkpoint_dir before the loop's last optimizer step"
        first.append(seen)
    step = max(first)
    last = min(len(life.steps) for life in uninterrupted)
    if step >= last:
        return (f"the first checkpoint appeared in ctx.checkpoint_dir after step {step - 1}, with no step "
                f"after it to kill before (the loop ran {last}); save every ctx.checkpoint_every steps from the start")
    return KillPlan("after-step", step=step)


def during_save_plan(uninterrupted: list[Life]) -> KillPlan | str:
    """Kill during the second round of torch.save calls into the checkpoint folder (the first
    when there is only one), on the highest rank that saves then; the others saving at that
    point finish first. A reason (str) when the loop wrote no checkpoint with torch.save."""
    last = min(len(life.steps) for life in uninterrupted)
    rounds = sorted({s.step for life in uninterrupted for s in life.saves if s.inside and s.ended and s.step < last})
    if not rounds:
        return ("no torch.save into ctx.checkpoint_dir before the loop's last step: a kill during the write "
                "is simulated inside torch.save (other writers are not interrupted)")
    step = rounds[1] if len(rounds) > 1 else rounds[0]
    savers = sorted({life.rank for life in uninterrupted for s in life.saves if s.inside and s.step == step})
    victim = savers[-1]
    peers = tuple(r for r in savers if r != victim)
    return KillPlan("during-save", step=step, rank=victim, peers=peers, path=_overwritten(uninterrupted[victim], step),
                    peer_saves=tuple(sum(1 for s in uninterrupted[r].saves if s.inside and s.ended and s.step == step)
                                     for r in peers))


def _overwritten(life: Life, step: int) -> str:
    """The path of the rank's first save after ``step`` that overwrites a file an earlier round
    wrote, when it is not the round's first save ("" otherwise: the first save is torn). A torn
    overwrite loses the previous checkpoint; a torn new file (model_{epoch}.pth before an
    in-place checkpoint.pth, as torchvision's classification reference saves) leaves it whole."""
    begun = [s for s in life.saves if s.inside and not s.ended]
    earlier = {s.path for s in begun if s.step < step}
    paths = [s.path for s in begun if s.step == step]
    return next((path for path in paths[1:] if path in earlier), "")


def during_save_guess(every: int) -> KillPlan:
    """``during_save_plan`` as it comes out for the common loop, before the uninterrupted run
    has said: rank 0 alone saves every ``every`` steps (ctx.checkpoint_every), so the second
    save round is after step 2 x every, with no peer. A guess only: the uninterrupted run
    copies its folder at this point, and the copy stands in for a killed first life only when
    the plan is the same (``copied_at``)."""
    return KillPlan("during-save", step=2 * every, rank=0, peers=())


SCENARIOS = (UNINTERRUPTED, KILLED_BETWEEN, KILLED_DURING_SAVE)
