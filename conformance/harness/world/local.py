"""The supervised local world: N spawned rank processes driven by a supervisor that never
joins a collective.

    world = World(world_size=2, backend="gloo", deadline=30)
    results = world.run(fn, x)        # fn(ctx, x) on every rank -> [RankResult, ...]
    world.close()

Why a supervisor that stays out of the process group: a rank stuck in a C++ collective cannot
be interrupted from Python, and signal-based timeouts wait for the backend's own timeout (gloo:
30 minutes by default). Only a process outside the group can keep time, take stacks and kill.
"""

from __future__ import annotations

import atexit
import itertools
import multiprocessing as mp
import multiprocessing.util  # noqa: F401  (its exit handler is registered before ours: ours runs first)
import os
import pickle
import shutil
import signal
import socket
import tempfile
import time
import weakref
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, Callable

from ..timing import CLOSE_GRACE_S, DEFAULT_DEADLINE_S, WORLD_START_S, pg_timeout_for
from . import _zygote
from ._caches import compile_cache_env
from ._containment import cookie_in_environment, guardian, new_cookie, proc_state, reap
from ._launch_env import world_environments
from ._loopback import LOOPBACK_HOST, loopback_interface
from ._netns import PrivateNetwork
from ._protocol import ProtocolError, decode, encode
from ._rank import RankConfig, rank_main, stack_file
from ._results import RankError, RankFailure, RankResult, T, WorldError, WorldHang, WorldUnavailable

BACKENDS = ("gloo", "nccl")

# After one rank fails, how long its peers get to notice (a dead gloo peer is seen in ~0.03 s)
# before the survivors are treated as blocked on it and the world is killed.
DEFAULT_GRACE_S = 3.0
# The longest faulthandler gets to write a stack after SIGUSR1. It writes from the signal
# handler, even while the rank is blocked in C++, so this is only a bound for a process that
# cannot be scheduled (the wait ends as soon as every dump has arrived).
STACK_WAIT_S = 1.0


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _rank_of_cause(error: RankError | None) -> int:
    """Sort key: a death or a protocol breach is a root cause; an exception may be a symptom."""
    if error is None:
        return 3
    return {"died": 0, "protocol": 0, "exception": 1}.get(error.kind, 2)


def _is_timeout(error: RankError) -> bool:
    text = f"{error.exc_type} {error.message}".lower()
    return error.kind == "exception" and ("timed out" in text or "timeout" in text)


#: Every World of this process that may have ranks: killed at interpreter exit (below).
_LIVE: weakref.WeakSet[World] = weakref.WeakSet()


@atexit.register
def _kill_at_exit() -> None:
    """Ranks are not daemonic (so that they can start children: DataLoader workers, pools), and
    multiprocessing's own exit handler joins non-daemonic children: a world that was never
    closed would keep this process from exiting. Kill them first (atexit runs handlers in
    reverse order of registration, and multiprocessing's was registered on import, above)."""
    for world in list(_LIVE):
        try:
            world.kill()
        except Exception:  # noqa: BLE001 - exiting anyway; the guardian is the last resort
            pass


class World:
    """A pool of ``world_size`` rank processes with an initialised process group.

    Persistent: the same processes serve every call until one fails or hangs; then the world
    is killed at once and the next call starts a fresh one (``generation`` counts restarts).

    A call that fails raises a world error (``RankFailure``, ``WorldHang``) and nothing else;
    ``on_error``, set by the world's owner, sees it first and may raise its own error instead
    (the Session turns a rank's TargetError into the run's usage error, ``harness/session.py``).
    """

    on_error: Callable[[WorldError], None] | None = None

    def __init__(self, world_size: int = 2, backend: str = "gloo", *, deadline: float = DEFAULT_DEADLINE_S,
                 pg_timeout: float | None = None, start_timeout: float = WORLD_START_S,
                 devices: list[int] | None = None, env: dict[str, str] | None = None,
                 threads: int = 1, grace: float = DEFAULT_GRACE_S,
                 preload: tuple[str, ...] = (), private_network: bool = False) -> None:
        if world_size < 1:
            raise ValueError(f"world_size={world_size} must be at least 1")
        if backend not in BACKENDS:
            raise ValueError(f"backend={backend!r} is not one of {', '.join(BACKENDS)}")
        if deadline <= 0:
            raise ValueError(f"deadline={deadline} must be positive seconds")
        if backend == "nccl":
            devices = list(devices) if devices is not None else None
            if devices is None or len(devices) < world_size:
                have = 0 if devices is None else len(devices)
                raise WorldUnavailable(
                    f"world_size={world_size} exceeds the {have} GPUs available to this process; "
                    f"pass a world size of at most {have} or use backend gloo")
        self.world_size = world_size
        self.backend = backend
        self.deadline = deadline
        # The process-group timeout is shorter than the deadline, so a rank blocked on a dead
        # or stuck peer raises by itself before the supervisor has to kill it.
        self.pg_timeout = pg_timeout if pg_timeout is not None else pg_timeout_for(deadline)
        self.start_timeout = start_timeout
        self.devices = devices
        self.env = {"TORCH_DISTRIBUTED_DEBUG": "INFO", **(env or {})}
        self.threads = threads
        self.grace = grace
        # Modules every rank imports before it reports ready: the suite's own warm-up is on the
        # start clock (start_timeout), never inside a call's deadline, where a slow import on
        # a loaded host would read as the user's hang. A launched world overlaps it with the
        # supervisor's other work.
        self.preload = tuple(preload)
        # The ranks in a network namespace of their own, whose loopback a check can shape
        # (``link``): _netns.py. Starting it raises NetworkUnavailable where it cannot be made.
        self.private_network = private_network
        self._network: PrivateNetwork | None = None
        self.generation = 0
        self.restarts: list[str] = []  # why each previous generation was replaced
        self._procs: list[Any] = []
        self._conns: list[Any] = []
        self._ready = False  # every rank reported "ready" since the last launch
        self._store: Any = None
        self._tmpdir: str | None = None
        self._cookie: str | None = None
        # CPU worlds fork rank r from zygote r (_zygote.py); until they have finished their
        # imports, the ranks' configs wait here (``_fork_deferred``), so launch never blocks.
        self._zygotes: list[_zygote.Zygote] = []
        self._deferred: list[RankConfig] = []
        self._calls = itertools.count()

    # -- lifecycle -----------------------------------------------------------------------

    @property
    def alive(self) -> bool:
        return bool(self._procs) and all(p.is_alive() for p in self._procs)

    @property
    def hostnames(self) -> list[str]:
        """Local ranks all run on this host."""
        return [socket.gethostname()] if self._procs else []

    @property
    def pids(self) -> list[int]:
        self._fork_deferred()
        return [p.pid for p in self._procs]

    @property
    def link(self) -> PrivateNetwork | None:
        """The private network the ranks run in (``private_network=True``), once launched."""
        return self._network

    @property
    def tmpdir(self) -> Path | None:
        return Path(self._tmpdir) if self._tmpdir else None

    def start(self) -> World:
        """The ranks spawned (unless ``launch`` already did) and joined: ready for calls."""
        if not (self._procs or self._deferred) or (self._ready and not self.alive):
            self.launch()
        if not self._ready:
            try:
                self._fork_deferred()
                self._await_ready()
            except BaseException:
                # Ctrl-C/SIGTERM while the ranks are still joining: they would not read a stop
                # message either, so they go now rather than after close()'s grace period.
                self._kill()
                raise
            self._ready = True
        return self

    def launch(self) -> World:
        """Spawn the ranks and return at once, without waiting for them to join.

        A rank's start-up (a fresh interpreter, the torch import, the process group) takes
        seconds; a world launched early overlaps it with whatever the supervisor does next,
        and its first call (``start``) then waits only for what is left. Nothing can be lost
        by it: a rank that fails to start is reported by that first call, like any start.
        """
        if (self._procs and self.alive) or self._deferred:
            return self
        if self._procs:
            # A rank died between calls (seen rarely: gloo aborting in a rank's teardown after
            # its result was returned). Its results stand; note it and serve from a new world.
            codes = {p.name: p.exitcode for p in self._procs if not p.is_alive()}
            self.restarts.append(f"rank(s) exited between calls {codes}; world replaced")
        self._kill()
        import torch.distributed as dist

        _LIVE.add(self)
        self.generation += 1
        self._cookie = new_cookie()
        self._tmpdir = tempfile.mkdtemp(prefix=f"ddp-world-g{self.generation}-")
        # Registered before any rank exists: if this supervisor is SIGKILLed from here on,
        # the guardian kills everything carrying the cookie and removes the temp dir.
        guardian().watch(cookie=self._cookie, path=self._tmpdir)
        if self.private_network:
            port, store_file = 0, os.path.join(self._tmpdir, "rendezvous")
            try:
                with cookie_in_environment(self._cookie):
                    # The holder carries the cookie: the guardian reaps it with the ranks.
                    self._network = PrivateNetwork().start()
            except BaseException:
                self._kill()  # the temp dir and the guardian's registration go with it
                raise
        else:
            port, store_file = self._serve_store(dist), None
        # gloo picks its interface from the hostname unless told; pin it to loopback so the
        # ranks' own listening sockets are on 127.0.0.1 whatever /etc/hosts says.
        settings = {"GLOO_SOCKET_IFNAME": loopback_interface(), **compile_cache_env(self._tmpdir), **self.env}
        # Zygotes are shared by this process's CPU worlds (one per rank slot); their ranks adopt
        # this world's cookie and the environment given here (theirs is the zygote's).
        usable = _zygote.usable(self.backend, self.devices)
        self._zygotes = [_zygote.take(self.preload, r) for r in range(self.world_size)] if usable else []
        parents = [z.pid for z in self._zygotes] or [os.getpid()] * self.world_size  # ranks die with it
        # Each rank's whole environment: a torchrun worker's for this world (docs/rank-environment.md).
        # A private network's rendezvous port is known only inside it (_rank.py).
        envs = world_environments(_zygote.environment(), settings, world_size=self.world_size,
                                  master_addr=LOOPBACK_HOST, master_port=None if self.private_network else port)
        configs = [RankConfig(rank=r, world_size=self.world_size, backend=self.backend, store_host=LOOPBACK_HOST,
                              store_port=port, store_prefix=f"g{self.generation}", tmpdir=self._tmpdir,
                              store_file=store_file, netns=self._network.path if self._network else None,
                              generation=self.generation, pg_timeout_s=self.pg_timeout,
                              device_index=self.devices[r] if self.devices else None,
                              env=envs[r], threads=self.threads, parent_pid=parents[r], preload=self.preload,
                              cookie=self._cookie if self._zygotes else None)
                   for r in range(self.world_size)]
        if not all(z.wait_ready(0) for z in self._zygotes):
            self._deferred = configs  # forked by start() (or pids) once the zygotes are ready
        else:
            self._start_ranks(configs)
        return self

    def _start_ranks(self, configs: list[RankConfig]) -> None:
        # Spawn (a fresh interpreter) unless a zygote forks them: never fork a process that
        # touched CUDA or ran a torch op (_zygote.py says why the zygote is neither).
        ctx = mp.get_context("spawn")
        # spawn starts the supervisor's resource tracker with the first rank; start it before
        # the cookie is set, or it would carry the cookie and be killed with this world.
        from multiprocessing import resource_tracker

        resource_tracker.ensure_running()
        with cookie_in_environment(self._cookie or ""):
            for cfg in configs:
                parent, child = ctx.Pipe(duplex=True)
                # Not daemonic: a daemonic process may not start children, and the user's
                # normal code does (DataLoader(num_workers=2), multiprocessing.Pool). They stay
                # contained: die-with-parent, the rank's process group, the cookie, _LIVE.
                name = f"ddp-rank{cfg.rank}"
                proc = (self._zygotes[cfg.rank].process(rank_main, (cfg, child), name) if self._zygotes
                        else ctx.Process(target=rank_main, args=(cfg, child), name=name, daemon=False))
                proc.start()
                child.close()
                self._procs.append(proc)
                self._conns.append(parent)

    def _fork_deferred(self) -> None:
        """Fork the ranks that launch left for the zygote, once it is ready (within the start
        timeout; a zygote that died or never got ready fails the start as a rank would)."""
        if not self._deferred:
            return
        configs, self._deferred = self._deferred, []
        until = time.monotonic() + self.start_timeout
        try:
            if not all(z.wait_ready(until - time.monotonic()) for z in self._zygotes):
                raise _zygote.ZygoteFailed(f"its zygote did not import torch within {self.start_timeout:.0f} s")
            self._start_ranks(configs)
        except _zygote.ZygoteFailed as exc:
            self._kill()
            raise RankFailure(f"{self.backend} world of {self.world_size} failed to start: {exc}",
                              results=[RankResult(c.rank, error=RankError(kind="died", message=str(exc)))
                                       for c in configs]) from None

    def _serve_store(self, dist: Any) -> int:
        """The rendezvous store served by the supervisor; returns its port."""
        # Loopback only, by construction: the store serves on a socket bound to 127.0.0.1
        # (TCPStore("127.0.0.1", 0, is_master=True) alone listens on the wildcard address,
        # reachable from the network). Port 0: the kernel picks a free port, so concurrent
        # pytest-xdist workers never race for one.
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            listener.bind((LOOPBACK_HOST, 0))
            listener.listen(max(128, 2 * self.world_size))
            port = listener.getsockname()[1]
            self._store = dist.TCPStore(LOOPBACK_HOST, port, is_master=True, wait_for_workers=False,
                                        master_listen_fd=listener.fileno())
        except BaseException:
            listener.close()
            raise
        listener.detach()  # the store owns the descriptor now and closes it when it goes
        return port

    def _await_ready(self) -> None:
        waiting = set(range(self.world_size))
        errors: dict[int, RankError] = {}
        until = time.monotonic() + self.start_timeout
        while waiting and not errors:
            left = until - time.monotonic()
            if left <= 0:
                break
            for rank, kind, payload in self._poll(waiting, left):
                waiting.discard(rank)
                if kind in ("dead", "protocol"):
                    errors[rank] = payload
                elif payload.kind == "failed":
                    errors[rank] = payload.payload
                elif payload.kind != "ready":
                    errors[rank] = RankError(kind="protocol", message=f"sent {payload.kind!r} "
                                             f"before it was ready; the world is replaced")
        if waiting or errors:
            stacks = self._collect_stacks(sorted(waiting))
            self._kill()
            detail = "; ".join(f"rank {r} {e.describe()}" for r, e in sorted(errors.items()))
            if waiting and not errors:
                detail = f"ranks {sorted(waiting)} did not join within {self.start_timeout:.0f} s"
            results: list[RankResult[Any]] = [RankResult(r, error=errors.get(r)) for r in range(self.world_size)]
            raise RankFailure(f"{self.backend} world of {self.world_size} failed to start: {detail}",
                              results=results, stacks=stacks)

    def close(self) -> None:
        """Stop the ranks cleanly (they leave the process group), then make sure they are gone.

        The ranks get one shared grace period (CLOSE_GRACE_S), not one each: a rank still busy
        in user code or a collective will not read the stop message, and Ctrl-C must take
        every rank down within the interrupt budget however many are busy.
        """
        for conn in self._conns:
            try:
                conn.send_bytes(encode("stop"))
            except OSError:
                pass
        until = time.monotonic() + CLOSE_GRACE_S
        for proc in self._procs:
            proc.join(timeout=max(0.0, until - time.monotonic()))
            if proc.exitcode not in (0, None):
                # Seen rarely with gloo on torch 2.13: a rank aborts during interpreter shutdown
                # after all its work was returned. Nothing it computed is affected; keep a note.
                self.restarts.append(f"rank {proc.name} exited with {proc.exitcode} at shutdown")
        self.kill()

    def __enter__(self) -> World:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # last resort; close() is the contract
        try:
            self.kill()
        except Exception:
            pass

    def kill(self) -> None:
        """Kill every process of this world — ranks, their process groups (DataLoader workers)
        and anything they started, setsid children included (the cookie) — and reap the ranks."""
        for proc in self._procs:
            if proc.pid is None:
                continue
            # The group first (the rank leads its own); the pid too, in case the rank was
            # killed before its setpgid ran and still sits in ours.
            for kill, target in ((os.killpg, proc.pid), (os.kill, proc.pid)):
                try:
                    kill(target, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        if self._cookie:
            # Children that left the rank's process group (setsid, double fork) carry the
            # cookie in their environment: without this sweep they outlive a passing run.
            reap(self._cookie)
        for proc in self._procs:
            # SIGKILL cannot be caught: the join only waits for the kernel to tear it down.
            proc.join(timeout=5)
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []
        self._ready = False
        self._store = None
        self._deferred = []
        self._zygotes = []  # shared: they serve the next world
        if self._network is not None:
            # After the ranks: the namespace (its lo, its qdisc) goes with its last process.
            self._network.close()
            self._network = None
        if self._tmpdir:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
        if self._cookie or self._tmpdir:
            guardian().forget(cookie=self._cookie, path=self._tmpdir)
        self._cookie, self._tmpdir = None, None

    _kill = kill  # the start path's name for it (launch, _await_ready)

    # -- calls ---------------------------------------------------------------------------

    def run(self, fn: Callable[..., T], *args: Any, deadline: float | None = None,
            **kwargs: Any) -> list[RankResult[T]]:
        """Run ``fn(ctx, *args, **kwargs)`` on every rank; one RankResult per rank, in rank order.

        Raises RankFailure when a rank raised or died (``.results`` has every rank's outcome)
        and WorldHang when the deadline passed first. Either way the world is killed and the
        next call starts a fresh one.
        """
        self.start()
        budget = self.deadline if deadline is None else deadline
        call_id = next(self._calls)
        try:
            payload = encode("call", call_id, (fn, args, kwargs))
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            raise TypeError(f"cannot send {getattr(fn, '__qualname__', fn)!r} to the ranks ({exc}); "
                            f"work functions and their arguments must be picklable: define the "
                            f"function at module level in an importable module") from None
        try:
            return self._call(call_id, payload, budget)
        except BaseException:
            # Ctrl-C, SIGTERM (raised as KeyboardInterrupt) or any error in the supervisor
            # while ranks are busy: kill them now. A busy rank never reads a stop message, so
            # leaving it to close() would cost its whole grace period; the interrupt budget
            # is 2 s for every rank together.
            if self._procs:
                self.restarts.append("supervisor interrupted during a call")
                self.kill()
            raise

    def _call(self, call_id: int, payload: bytes, budget: float) -> list[RankResult]:
        started = time.monotonic()
        for conn in self._conns:
            try:
                conn.send_bytes(payload)
            except OSError:
                pass  # that rank just died; its sentinel reports it below with its exit code
        results: dict[int, RankResult] = {}
        # When each failed rank's failure reached the supervisor: the first one is the
        # culprit the headline names (a peer's "connection reset" comes after the death).
        failed_at: dict[int, float] = {}
        waiting = set(range(self.world_size))
        while waiting:
            now = time.monotonic()
            until = started + budget
            if failed_at:
                until = min(until, min(failed_at.values()) + self.grace)
            if now >= until:
                break
            for rank, kind, message in self._poll(waiting, until - now):
                waiting.discard(rank)
                if kind in ("dead", "protocol"):
                    results[rank] = RankResult(rank, error=message, pid=self._procs[rank].pid)
                elif message.kind != "result" or message.call_id != call_id:
                    results[rank] = RankResult(rank, error=RankError(
                        kind="protocol", message=f"answered call {message.call_id} with "
                        f"{message.kind!r} while call {call_id} was running; the world is replaced"),
                        pid=self._procs[rank].pid)
                elif not isinstance(message.payload, RankResult):
                    results[rank] = RankResult(rank, error=RankError(
                        kind="protocol", message=f"sent a {type(message.payload).__name__} as its "
                        f"result; the world is replaced"), pid=self._procs[rank].pid)
                else:
                    results[rank] = message.payload
                if results[rank].error is not None and rank not in failed_at:
                    failed_at[rank] = time.monotonic()
        elapsed = time.monotonic() - started
        if not waiting and not failed_at:
            return [results[r] for r in range(self.world_size)]
        return self._fail(results, sorted(waiting), budget, elapsed, failed_at)

    def _fail(self, results: dict[int, RankResult], waiting: list[int], budget: float,
              elapsed: float, failed_at: dict[int, float]) -> list[RankResult]:
        failed = bool(failed_at)
        # Stacks from *every* rank: the finished ones show where they are waiting on the
        # stuck one, which is often the only clue to which collective it never joined.
        stacks = self._collect_stacks(list(range(self.world_size)))
        for rank in waiting:
            why = ("still running when a peer failed (blocked on it)" if failed
                   else f"did not finish within the {budget:g} s deadline")
            results[rank] = RankResult(rank, error=RankError(kind="stuck", message=why),
                                       pid=self._procs[rank].pid)
        ordered = [results[r] for r in range(self.world_size)]
        self.restarts.append("hang" if not failed else "failure")
        self.kill()
        # A peer that gave up on a collective because of its own process-group timeout is a
        # symptom, not a cause: with ranks still running, that is a hang, not a crash.
        if failed and waiting and all(_is_timeout(r.error) for r in ordered
                                      if r.error is not None and r.error.kind != "stuck"):
            failed = False
        if failed:
            culprits = [r for r in ordered if r.error is not None and r.error.kind != "stuck"]
            # Root causes first: a death explains its peers' "connection reset" errors, and
            # the rank whose failure arrived first is the one that stopped first.
            culprits.sort(key=lambda r: (_rank_of_cause(r.error), failed_at.get(r.rank, 0.0), r.rank))
            bad = "; ".join(f"rank {r.rank} {r.error.describe()}" for r in culprits
                            if r.error is not None)
            extra = f"; ranks {waiting} were blocked and killed" if waiting else ""
            raise self._raised(RankFailure(f"{bad}{extra}", results=ordered, stacks=stacks, elapsed_s=elapsed,
                                           culprit=culprits[0] if culprits else None))
        raise self._raised(WorldHang(
            f"hang: ranks {waiting} did not finish within the {budget:g} s deadline "
            f"(detected after {elapsed:.2f} s); every rank's stack was collected and the world killed",
            stuck_ranks=waiting, results=ordered, stacks=stacks, elapsed_s=elapsed))

    def _raised(self, error: WorldError) -> WorldError:
        """``error``, once the owner's ``on_error`` has seen it (it may raise its own instead)."""
        if self.on_error is not None:
            self.on_error(error)
        return error

    def _poll(self, ranks: set[int], timeout: float) -> list[tuple[int, str, Any]]:
        """Wait for a message or a death among ``ranks``:
        (rank, "msg", Message) | (rank, "dead" | "protocol", RankError)."""
        by_obj: dict[Any, tuple[int, str]] = {}
        for rank in ranks:
            by_obj[self._conns[rank]] = (rank, "msg")
            by_obj[self._procs[rank].sentinel] = (rank, "dead")
        out: dict[int, tuple[int, str, Any]] = {}
        for obj in wait(list(by_obj), timeout=max(timeout, 0)):
            rank, kind = by_obj[obj]
            if rank in out:
                continue
            conn = self._conns[rank]
            # A rank can send its result and exit in the same instant: read the pipe first.
            if conn.poll():
                try:
                    frame = conn.recv_bytes()
                except (EOFError, OSError):
                    pass
                else:
                    try:
                        out[rank] = (rank, "msg", decode(frame))
                    except ProtocolError as exc:
                        out[rank] = (rank, "protocol", RankError(
                            kind="protocol", message=f"sent a malformed message: {exc}; the world "
                            f"is replaced"))
                    continue
            proc = self._procs[rank]
            proc.join(timeout=1.0)
            out[rank] = (rank, "dead", RankError(kind="died", message="", exitcode=proc.exitcode))
        return list(out.values())

    def _collect_stacks(self, ranks: list[int]) -> dict[int, str]:
        if not self._tmpdir:
            return {}
        offsets: dict[int, int] = {}
        signalled: list[int] = []
        for rank in ranks:
            path = stack_file(self._tmpdir, rank)
            offsets[rank] = path.stat().st_size if path.exists() else 0
            proc = self._procs[rank]
            if proc.is_alive():
                try:
                    os.kill(proc.pid, signal.SIGUSR1)
                    signalled.append(rank)
                except ProcessLookupError:
                    pass
        # A stopped process (SIGSTOP, a frozen driver call traced by a debugger) runs no
        # handler until it is continued: waiting for its dump would only add latency.
        stopped = [r for r in signalled if proc_state(self._procs[r].pid) in ("T", "t")]
        signalled = [r for r in signalled if r not in stopped]
        # Wait for the dumps themselves (each file grows once its handler ran), not a fixed time.
        until = time.monotonic() + STACK_WAIT_S
        while signalled and time.monotonic() < until:
            signalled = [r for r in signalled if _size(stack_file(self._tmpdir, r)) <= offsets[r]]
            time.sleep(0.005)
        time.sleep(0.02)  # a dump that has started is a few writes long: let the last one land
        stacks = {}
        for rank in ranks:
            path = stack_file(self._tmpdir, rank)
            if not path.exists():
                continue
            with open(path, "rb") as f:
                # A dead rank's file ends with its fatal-error stack: keep all of it. A live
                # rank's file may hold older dumps: read only what this SIGUSR1 produced.
                if self._procs[rank].is_alive():
                    f.seek(offsets[rank])
                text = f.read().decode(errors="replace")
            if text.strip():
                stacks[rank] = text
        for rank in stopped:
            stacks[rank] = stacks.get(rank, "") + "(process is stopped: no Python stack can be taken)\n"
        return stacks
