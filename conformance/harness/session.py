"""One suite session in one process: its settings, its worlds, and running a check into a record.

The pytest plugin creates one Session per pytest (or pytest-xdist worker) process; so does a
benchmark. It keeps one persistent world per (backend, world size) and replaces it whenever a
call failed or hung, so a broken world never serves the next check.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ddp_conformance.reports.keys import EXHAUSTED
from ddp_conformance.reports.schema import CheckRecord

from .context import CheckContext, entry_of
from .exhaustion import exhausted
from .outcome import Outcome
from .registry import MIGRATION_CHECK, CheckSpec
from .resources import CostMeter, model_size_on_rank, size_metrics
from .root_cause import RootCauses
from .targets import BUILTINS, TargetError, TargetInfo, load_target, raise_target_error
from .timing import DEFAULT_DEADLINE_S
from .world import (
    LaunchedWorldUnreachable,
    World,
    WorldError,
    WorldLike,
    WorldUnavailable,
    compile_cache_env,
    guardian,
)


def _session_tmp() -> Path:
    path = Path(tempfile.mkdtemp(prefix="ddp-session-"))
    # Removed by close(); if this process is killed first, the guardian removes it.
    guardian().watch(path=str(path))
    return path


#: What every world's ranks import before they report ready (``World``'s ``preload``): DDP's
#: constructor imports torch._dynamo, ~1 s (several on a loaded host) of the first check that
#: wraps a model in each process. That is the suite's warm-up, so it is on the start clock,
#: outside the user's deadline: inside it, a short --deadline on a loaded host named a rank
#: still importing it as the culprit of a hang.
PERSISTENT_PRELOAD = ("torch._dynamo",)

#: Memory-backed file system for scratch that lives seconds (a reference's snapshots);
#: ``DDP_CONFORMANCE_SHM`` names another one (a larger tmpfs where /dev/shm is a container's
#: 64 MB), or ``off`` for none.
SHM = Path("/dev/shm")
SHM_ENV = "DDP_CONFORMANCE_SHM"


def _session_memory() -> Path | None:
    """The session's folder in memory (``/dev/shm``), or None where the host has none.

    Snapshots written there skip the disk's write-back (``conformance/checks/equivalence/snapshots.py``);
    what is in it is RAM until removed, so the guardian removes it if this process is killed,
    like the temp dir."""
    where = os.environ.get(SHM_ENV, "").strip()
    if where.lower() == "off":
        return None
    shm = Path(where) if where else SHM
    if not (shm.is_dir() and os.access(shm, os.W_OK | os.X_OK)):
        return None
    try:
        path = Path(tempfile.mkdtemp(prefix="ddp-session-", dir=shm))
    except OSError:
        return None
    guardian().watch(path=str(path))
    return path


def _target_error(error: WorldError) -> None:
    """Every world of a session: a TargetError raised on a rank (the user's own code) ends the
    run as a usage error with its one line (exit 2), never as a check's finding."""
    raise_target_error(error.results)


@dataclass(frozen=True)
class Settings:
    backend: str = "gloo"  # resolved: gloo | nccl
    world_size: int = 2
    deadline: float = DEFAULT_DEADLINE_S
    target: str | None = None  # None: the built-in targets
    attach: bool = False
    keep_tmp: bool = False  # keep the session's temp dir (scratch of every check) for debugging
    link_gbps: float | None = None  # the user's interconnect per rank (--link-gbps): scaling-cliff
    suite: str = "full"  # ci | full: a check may run a smaller subject in the CI subset
    #: --compare-ddp: every check runs the target twice, through its parallelize and through DDP.
    compare_ddp: bool = False

    def targets_for(self, spec: CheckSpec) -> list[str]:
        """Conformance checks run on every built-in target; chaos and perf checks run once,
        on the vehicles they choose (label ``builtin``). With --target, everything runs on it."""
        if self.target is not None:
            from .targets.loading import VIA_DDP

            # ddp-migration runs both ways itself, once.
            both = self.compare_ddp and spec.id != MIGRATION_CHECK
            return [self.target, self.target + VIA_DDP] if both else [self.target]
        return list(BUILTINS) if spec.kind == "conformance" else ["builtin"]


@dataclass
class Session:
    settings: Settings
    _worlds: dict[tuple[str, int], WorldLike] = field(default_factory=dict)
    _model_sizes: dict[str, tuple[int, int] | None] = field(default_factory=dict)
    _infos: dict[str, TargetInfo] = field(default_factory=dict)
    _tmp: Path = field(default_factory=_session_tmp)
    _memory: Path | None = field(default_factory=_session_memory)
    # Where a long check's "still running" line goes (the plugin: the terminal); None: silent.
    progress: Callable[[str], None] | None = None
    # How that line names a (check id, target spec): the plugin names a run's only target once.
    label: Callable[[str, str], str] = lambda check_id, target: f"[ddp] {check_id} on {target}"
    # The run's memory of the first DDP error per target (``root_cause``): later checks that
    # hit it say so instead of failing again (the plugin's run; None: every record as it is).
    root_causes: RootCauses | None = None

    @property
    def tmpdir(self) -> Path:
        return self._tmp

    def world(self, backend: str | None = None, world_size: int | None = None) -> WorldLike:
        """The persistent world for (backend, world size), started on first use."""
        key = (backend or self.settings.backend, world_size or self.settings.world_size)
        world = self._worlds.get(key)
        if world is None:
            if self.settings.attach:
                from .world.attach import AttachedWorld, RankZeroLocalWorld

                if key[1] not in (1, self.settings.world_size):
                    raise RuntimeError(f"under --attach only the launched world of "
                                       f"{self.settings.world_size} and 1-rank references exist")
                launched = self._worlds.get((key[0], self.settings.world_size))
                if not isinstance(launched, AttachedWorld):
                    launched = AttachedWorld(key[0], deadline=self.settings.deadline)
                    launched.on_error = _target_error
                    self._worlds[(key[0], self.settings.world_size)] = launched
                world = launched if key[1] == self.settings.world_size else RankZeroLocalWorld(launched)
            else:
                world = self.new_world(backend=key[0], world_size=key[1], preload=PERSISTENT_PRELOAD,
                                       **self._reference_threads(key[0], key[1]))
            self._worlds[key] = world
        return world

    def _reference_threads(self, backend: str, world_size: int) -> dict[str, int]:
        """A gloo 1-rank world stands in for the N ranks of a reference: it computes what N
        one-thread ranks compute, so it gets N threads (as many as the host has) instead of
        one, and finishes in about the time one rank takes instead of N times it."""
        if backend != "gloo" or world_size != 1 or self.settings.world_size <= 1:
            return {}
        return {"threads": max(1, min(self.settings.world_size, os.cpu_count() or 1))}

    def prewarm(self, *, reference: bool) -> None:
        """Launch the persistent worlds now, without waiting for them (``World.launch``).

        Called at session start: the N-rank world's start-up (and, with ``reference``, the
        1-rank reference world's, which the equivalence checks need) overlaps with collection
        and with each other instead of adding seconds to the first check that needs them.
        A world that cannot exist here (more ranks than devices) is left for the check to
        report; attached worlds are the launcher's.
        """
        if self.settings.attach:
            return
        sizes = [self.settings.world_size] + ([1] if reference and self.settings.world_size > 1 else [])
        for size in sizes:
            try:
                world = self.world(world_size=size)
            except WorldUnavailable:
                continue
            if isinstance(world, World):
                world.launch()

    def ready(self) -> float:
        """Wait until the prewarmed worlds have joined; return the seconds this took.

        The run's start-up (ranks forked, torch imported, process groups joined) is the suite's
        own cost, not a check's: waited for here, it is the report's ``startup_s``, and the
        first check's time column no longer carries it. A world that fails to start is dropped,
        so the first check that needs it starts it again and reports the failure as its own.
        """
        started = time.perf_counter()
        for key, world in list(self._worlds.items()):
            if not isinstance(world, World):
                continue
            try:
                world.start()
            except BaseException as exc:
                world.kill()
                del self._worlds[key]
                if not isinstance(exc, Exception):
                    raise
        return time.perf_counter() - started

    def new_world(self, *, backend: str | None = None, world_size: int | None = None,
                  **kwargs: Any) -> World:
        from .world.devices import check_world

        backend = backend or self.settings.backend
        world_size = world_size or self.settings.world_size
        devices = check_world(backend, world_size)
        kwargs.setdefault("deadline", self.settings.deadline)
        kwargs.setdefault("preload", PERSISTENT_PRELOAD)
        # One compile cache for the run's worlds, removed with the session's temp dir: a fresh
        # world finds what an earlier one compiled, and nothing is left in $TMPDIR (_caches).
        kwargs["env"] = {**compile_cache_env(self._tmp), **(kwargs.get("env") or {})}
        world = World(world_size, backend, devices=devices, **kwargs)
        world.on_error = _target_error
        return world

    @property
    def hostnames(self) -> list[str]:
        """Every rank's host seen so far (attach mode knows them after its first call)."""
        return sorted({h for w in self._worlds.values() for h in w.hostnames})

    def close(self) -> None:
        """Close every world and remove the temp dir (kept with ``keep_tmp``). Safe twice."""
        try:
            # References first: the launched world must outlive the broadcasts they rely on.
            for world in sorted(self._worlds.values(), key=lambda w: w.world_size):
                world.close()
        finally:
            # Even if a close raised (or Ctrl-C came twice): no world may keep running.
            for world in self._worlds.values():
                if isinstance(world, World):
                    world.kill()
            self._worlds.clear()
            if not self.settings.keep_tmp:
                shutil.rmtree(self._tmp, ignore_errors=True)
            guardian().forget(path=str(self._tmp))
            if self._memory is not None:  # RAM: never kept
                shutil.rmtree(self._memory, ignore_errors=True)
                guardian().forget(path=str(self._memory))
                self._memory = None

    def target_info(self, target_spec: str) -> TargetInfo:
        """What the checks of this session know of a target (cached), without importing it here.

        A built-in target is the suite's own code, loaded in this process. A user's target is
        loaded in a child under the run's deadline (``world/validate.py``): its import may exit
        the process, hang, start threads or processes, trap signals or change directory, and
        none of that may reach the supervisor. Under --attach this process is a rank, which
        runs the target anyway. Raises TargetError (a usage error) when it cannot be loaded."""
        if target_spec not in self._infos:
            if target_spec in BUILTINS or self.settings.attach:
                info = load_target(target_spec).info()
            else:
                from .world.validate import describe_target

                info = describe_target(target_spec, self.settings.world_size,
                                       deadline=self.settings.deadline, build=False)
            self._infos[target_spec] = info
        return self._infos[target_spec]

    def context(self, spec: CheckSpec, target_spec: str) -> CheckContext:
        label = "mlp" if target_spec == "builtin" else target_spec
        return CheckContext(
            spec=spec, target=self.target_info(label), backend=self.settings.backend,
            world_size=self.settings.world_size, deadline=self.settings.deadline,
            injected=target_spec == "builtin", tmpdir=Path(tempfile.mkdtemp(dir=self._tmp)),
            memory_dir=self._memory,
            pool=self.world, new_world=None if self.settings.attach else self.new_world,
            attached=self.settings.attach, link_gbps=self.settings.link_gbps, suite=self.settings.suite)

    def run_check(self, spec: CheckSpec, target_spec: str) -> tuple[CheckRecord, CheckContext | None]:
        """Run one check into its record. Never raises, except TargetError (a usage error) and
        LaunchedWorldUnreachable (under --attach: nothing can run).

        A check that raises is ``inconclusive`` with the error attached (the harness could not
        decide), never ``passed``; an environment that cannot host it is ``skipped``.
        """
        started = time.perf_counter()
        ctx: CheckContext | None = None
        meter = CostMeter(label=self.label(spec.id, target_spec), progress=self.progress)
        try:
            ctx = self.context(spec, target_spec)
            with meter:
                outcome = entry_of(spec)(ctx)
            if not isinstance(outcome, Outcome):
                raise TypeError(f"check {spec.id} returned {type(outcome).__name__}, not an Outcome")
        except (TargetError, LaunchedWorldUnreachable):
            raise
        except WorldUnavailable as exc:
            outcome = Outcome.skipped(str(exc))
        except Exception as exc:
            short = exhausted(exc)  # a full disk, too few file descriptors: the host's, said so
            outcome = Outcome.inconclusive(
                f"the check could not run: {short}" if short else
                f"the check itself failed: {type(exc).__name__}: {exc}",
                evidence={"harness_error": "".join(traceback.format_exception(exc))[-8000:],
                          **({EXHAUSTED: short} if short else {})})
        if self.root_causes is not None:
            outcome = self.root_causes.relate(spec.id, target_spec, outcome)
        record = CheckRecord(
            id=spec.id, title=spec.title, kind=spec.kind, status=outcome.status,
            duration_s=round(time.perf_counter() - started, 4), message=outcome.message,
            metrics={**outcome.metrics, **self._cost_metrics(meter, ctx)}, evidence=outcome.evidence,
            recommendation=outcome.recommendation, target=target_spec)
        return record, ctx

    def _cost_metrics(self, meter: CostMeter, ctx: CheckContext | None) -> dict[str, Any]:
        """The check's peak memory, and its model's size when it ran on a target (vehicles vary)."""
        cost = meter.cost.metrics() if meter.cost is not None else {}
        if ctx is None or ctx.injected:
            return cost
        return {**cost, **size_metrics(self._model_size(ctx))}

    def _model_size(self, ctx: CheckContext) -> tuple[int, int] | None:
        """(parameters, bytes) of the target's model, counted once per target on a rank."""
        spec = ctx.target.spec
        if spec not in self._model_sizes:
            try:
                self._model_sizes[spec] = ctx.world().run(model_size_on_rank, spec)[0].value
            except Exception:  # noqa: BLE001 -- a size is evidence, never a reason to fail a check
                self._model_sizes[spec] = None
        return self._model_sizes[spec]
