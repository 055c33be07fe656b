"""Fresh CPU worlds fork their ranks from a zygote that has already imported torch.

A rank's start is mostly its imports: a fresh interpreter importing torch, torch.distributed
and the suite's warm-up (``torch._dynamo``) takes 3-4 s of one core on a quiet 2-core host and
10-25 s under load, once per rank, for every fresh world (the test suite starts hundreds; the
resume-equivalence check five). A zygote is a fork server (multiprocessing's own ``forkserver``
loop) that did those imports once; a supervisor process keeps one per rank slot and forks rank
r of every CPU world from zygote r: a new pid, a new process group, the process group
initialised after the fork, the user's code imported after the fork, so a rank (and a restart)
is still a fresh start of the user's code; only the imports are shared.

What keeps it sound (each held by a test in tests/world/test_zygote.py):
- **No torch op, no CUDA, ever, in the zygote**: it only imports. A fork after torch ran an
  op with its OpenMP pool active makes the child's first parallel op hang (world/validate.py);
  a forked CUDA context is unusable. So only gloo worlds without devices use it (``usable``);
  any world with GPUs or NCCL spawns its ranks, as before.
- **Each rank carries its own world's cookie** (``_containment.py``): /proc/PID/environ shows
  a process's exec-time environment block, which a forked rank copies from the zygote. The
  zygote is started with a cookie of its own, padded to ``COOKIE_ROOM`` characters; a forked
  rank first overwrites it in place, in its own copy of that block, with its world's cookie
  (``adopt``, as setproctitle rewrites argv), and in ``os.environ`` for what it execs. Every
  rank and every process it starts then carries the world's cookie, and ``reap(cookie)`` kills
  the world's tree and nothing else; the zygote's own cookie is the guardian's (and ``close``'s)
  to reap with whatever was forked but not yet adopted.
- **Die with the parent, both links**: the zygote dies with the supervisor (PDEATHSIG, set
  before its imports), a rank with its zygote (``RankConfig.parent_pid`` is the zygote's pid).
- **Randomness as a fresh process has it**: Python's ``random`` reseeds itself in a forked
  child; NumPy's global generator and torch's default CPU generator (which this torch seeds
  from the OS at import) do not, so the child reseeds them from the OS. The str hash seed and
  the address layout (ASLR) are fixed at an interpreter's exec: one exec'd zygote per rank slot
  gives the ranks of a world different ones, as spawned or torchrun-started ranks have, so a
  set of names (hash order) or of parameters/modules (address order) iterated in a different
  order per rank stays visible to the checks; rank r of two worlds shares one.
  ``DDP_CONFORMANCE_START=spawn`` spawns every rank, for a target that needs more.
- **The supervisor's environment**: a zygote whose exec-time environment no longer matches the
  supervisor's is replaced, so a rank's environment is what a spawned rank's would be.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import os
import select
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from multiprocessing import forkserver, popen_forkserver, reduction, resource_tracker, spawn, util
from multiprocessing.context import set_spawning_popen
from multiprocessing.process import BaseProcess
from typing import Any, Callable

from ._caches import compile_cache_env
from ._containment import COOKIE_VAR, cookie_in_environment, die_with_parent, guardian, new_cookie, proc_state, reap

#: ``DDP_CONFORMANCE_START=spawn``: every rank spawned (a fresh interpreter each), no zygote.
START_ENV = "DDP_CONFORMANCE_START"
#: What every zygote imports before it forks a rank (plus the world's own ``preload``).
BASE_MODULES = ("torch", "torch.distributed", "conformance.harness.world._rank")
#: The characters a zygote's cookie occupies in its environment block: room for any world's.
COOKIE_ROOM = 64
#: How long a fork request may wait for the zygote's answer once it said it was ready.
FORK_TIMEOUT_S = 30.0


def usable(backend: str, devices: list[int] | None) -> bool:
    """A zygote serves CPU worlds only: gloo with no device (ranks that touch CUDA are spawned)."""
    return backend == "gloo" and not devices and os.environ.get(START_ENV, "").strip().lower() != "spawn"


#: What changes between two worlds of one supervisor without changing what a rank imports:
#: not a reason to replace the zygote (a rank gets the supervisor's value: ``environment``).
VOLATILE = (COOKIE_VAR, "PYTEST_CURRENT_TEST")


def environment() -> dict[str, str]:
    """The supervisor's environment as a rank forked now must see it (less the cookie)."""
    return {k: v for k, v in os.environ.items() if k != COOKIE_VAR}


def _stable() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in VOLATILE}


class ZygoteFailed(RuntimeError):
    """The zygote died or did not answer: the world fails to start, like a rank that cannot."""


class Zygote:
    """One fork server: the imports done once, every CPU world's ranks forked from it."""

    def __init__(self, preload: tuple[str, ...] = ()) -> None:
        self.preload = tuple(preload)
        self.environment = _stable()
        self.forked: list[int] = []  # pids of the ranks forked, for retiring it (``take``)
        self.cookie = f"{new_cookie()}-zygote-".ljust(COOKIE_ROOM, "z")
        # Started before the cookie is set (World.launch does the same): the tracker is the
        # supervisor's, shared by every world, and must not be reaped with this one.
        resource_tracker.ensure_running()
        guardian().watch(cookie=self.cookie)
        modules = [*BASE_MODULES, *(m for m in self.preload if m not in BASE_MODULES)]
        # The fork requests' socket, in a private folder (removed by close, or by the guardian),
        # named through the folder's descriptor: a deep TMPDIR would exceed AF_UNIX's 108 bytes.
        self._folder = tempfile.mkdtemp(prefix="ddp-zygote-")
        guardian().watch(path=self._folder)
        self._folder_fd = os.open(self._folder, os.O_RDONLY)
        self._address = f"/proc/self/fd/{self._folder_fd}/socket"
        with socket.socket(socket.AF_UNIX) as listener:
            listener.bind(self._address)
            listener.listen()
            alive_r, self._alive_w = os.pipe()
            self._ready_r, ready_w = os.pipe()
            # Its imports (torch._dynamo) create inductor's cache folder: in its own, removed with it.
            cache = compile_cache_env(self._folder)
            # The supervisor's sys.path before the first import: `-c` puts the working directory
            # first, and a user's own top-level `conformance/` there would be imported instead.
            code = (f"import sys; sys.path[:] = {sys.path!r}; "
                    f"from conformance.harness.world._zygote import zygote_main; zygote_main({os.getpid()}, "
                    f"{listener.fileno()}, {alive_r}, {ready_w}, {modules!r}, {sys.path!r}, {cache!r})")
            exe = spawn.get_executable()
            try:
                with cookie_in_environment(self.cookie):
                    flags = util._args_from_interpreter_flags()  # type: ignore[attr-defined]
                    self.pid = util.spawnv_passfds(exe, [exe, *flags, "-c", code],  # type: ignore[arg-type]
                                                   [listener.fileno(), alive_r, ready_w])
            finally:
                os.close(alive_r)
                os.close(ready_w)
        self._ready: bool | None = None  # None: not known yet; False: died before it was ready
        self._ready_lock = threading.Lock()
        self._closed = False

    def __reduce__(self) -> tuple[Callable[[], None], tuple[()]]:
        # A rank's process object refers to its zygote; the rank has no use for it.
        return (_nothing, ())

    def wait_ready(self, timeout: float) -> bool:
        """True once the zygote finished its imports (False: not within ``timeout``).
        Raises ZygoteFailed when it died first. Safe from several threads (worlds started
        side by side): one reads the zygote's answer, the others then see it."""
        with self._ready_lock:
            return self._wait_ready(timeout)

    def _wait_ready(self, timeout: float) -> bool:
        if self._ready is None:
            if not select.select([self._ready_r], [], [], max(0.0, timeout))[0]:
                return False
            self._ready = os.read(self._ready_r, 1) == b"1"
        if not self._ready:
            raise ZygoteFailed("the zygote that forks the ranks exited during its imports")
        return True

    def process(self, target: Callable[..., Any], args: tuple[Any, ...], name: str) -> BaseProcess:
        """A (not yet started) process that ``start()`` forks from this zygote."""
        proc = ZygoteProcess(target=target, args=args, name=name, daemon=False)
        proc._zygote = self
        return proc

    def alive(self) -> bool:
        try:
            return os.waitpid(self.pid, os.WNOHANG) == (0, 0)
        except ChildProcessError:
            return False

    def connect(self, fds: list[int]) -> tuple[int, int]:
        """multiprocessing's ``ForkServer.connect_to_new_process``, for this zygote."""
        if self._closed:
            raise ZygoteFailed("the world's zygote was already closed")
        with socket.socket(socket.AF_UNIX) as client:
            client.connect(self._address)
            parent_r, child_w = os.pipe()
            child_r, parent_w = os.pipe()
            try:
                tracker = resource_tracker.getfd()
                assert tracker is not None, "started in __init__"
                reduction.sendfds(client, [child_r, child_w, self._alive_w, tracker, *fds])
                return parent_r, parent_w
            except BaseException:
                os.close(parent_r)
                os.close(parent_w)
                raise
            finally:
                os.close(child_r)
                os.close(child_w)

    def close(self, *, sweep: bool = True) -> None:
        """Kill the zygote and whatever it forked that has not adopted a world's cookie yet; safe
        twice. ``sweep=False`` (at exit, every zygote killed first): kill and wait for the zygote
        only; a fork it had not handed over dies with it (PDEATHSIG), and the guardian, still
        watching the cookie, sweeps once this process is gone."""
        if self._closed:
            return
        self._closed = True
        if sweep:
            reap(self.cookie)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(self.pid, 0)
        for fd in (self._alive_w, self._ready_r, self._folder_fd):
            os.close(fd)
        shutil.rmtree(self._folder, ignore_errors=True)
        guardian().forget(cookie=self.cookie if sweep else None, path=self._folder)


def _nothing() -> None:
    return None


class _Popen(popen_forkserver.Popen):
    """multiprocessing's forkserver Popen, asking this process's zygote instead of the global
    fork server (whose environment, and so cookie, would be the first world's)."""

    def _launch(self, process_obj: Any) -> None:
        zygote: Zygote = process_obj._zygote
        prep_data = spawn.get_preparation_data(process_obj._name)
        buf = io.BytesIO()
        set_spawning_popen(self)
        try:
            reduction.dump(prep_data, buf)
            reduction.dump(process_obj, buf)
        finally:
            set_spawning_popen(None)
        self.sentinel, w = zygote.connect(self._fds)  # type: ignore[attr-defined]  # (the stub lacks it)
        _parent_w = os.dup(w)
        self.finalizer = util.Finalize(self, util.close_fds, (_parent_w, self.sentinel))  # type: ignore[attr-defined]
        with open(w, "wb", closefd=True) as f:
            f.write(buf.getbuffer())
        if not select.select([self.sentinel], [], [], FORK_TIMEOUT_S)[0]:
            raise ZygoteFailed(f"the zygote did not fork a rank within {FORK_TIMEOUT_S:g} s")
        try:
            self.pid = forkserver.read_signed(self.sentinel)
        except EOFError:
            raise ZygoteFailed("the zygote exited instead of forking a rank") from None
        zygote.forked.append(self.pid)


    def wait(self, timeout: float | None = None) -> int | None:
        """The exit code, once the process is really gone. The zygote reports a death when it
        reaps the rank, or 255 at once when the zygote itself was killed first: then wait for
        the kernel to finish tearing the rank down, as a waitpid on a spawned rank does."""
        code = super().wait(timeout)
        if code is not None and self.pid is not None:
            until = time.monotonic() + (5.0 if timeout is None else timeout)
            while _running(self.pid) and time.monotonic() < until:
                time.sleep(0.005)
        return code


def _running(pid: int) -> bool:
    return proc_state(pid) not in ("", "Z", "X")


class ZygoteProcess(BaseProcess):
    _start_method = "forkserver"
    _zygote: Zygote

    @staticmethod
    def _Popen(process_obj: Any) -> Any:
        return _Popen(process_obj)


# -- this process's zygotes ----------------------------------------------------------------

_zygotes: dict[tuple[tuple[str, ...], int], Zygote] = {}
#: Replaced zygotes whose ranks may still serve a world: a rank dies with its zygote, so one
#: is closed only once everything it forked is gone (or at exit).
_retired: list[Zygote] = []
_owner: int | None = None


def take(preload: tuple[str, ...] = (), slot: int = 0) -> Zygote:
    """This process's zygote for rank ``slot`` with ``preload`` (started now on first use: its
    imports may still be under way), replaced when it died or the environment changed since."""
    global _owner
    if _owner != os.getpid():  # a forked supervisor does not own its parent's zygotes
        _zygotes.clear()
        _retired.clear()
        _owner = os.getpid()
    for old in [z for z in _retired if not any(_running(pid) for pid in z.forked)]:
        _retired.remove(old)
        old.close()
    key = (tuple(preload), slot)
    zygote = _zygotes.get(key)
    if zygote is not None and (zygote.environment != _stable() or not zygote.alive()):
        _retired.append(_zygotes.pop(key))
        zygote = None
    if zygote is None:
        zygote = _zygotes[key] = Zygote(key[0])
    return zygote


def zygote_pids() -> list[int]:
    """The pids of this process's zygotes (they outlive the worlds they serve: not a leak)."""
    return [z.pid for z in [*_zygotes.values(), *_retired]] if _owner == os.getpid() else []


@atexit.register
def close_all() -> None:
    """Kill this process's zygotes at exit, all at once (an interrupted run must exit within its
    budget: no sweep per zygote; the guardian sweeps their cookies after this process)."""
    if _owner != os.getpid():
        return
    zygotes = [*_zygotes.values(), *_retired]
    _zygotes.clear()
    _retired.clear()
    for zygote in zygotes:
        with contextlib.suppress(ProcessLookupError):
            os.kill(zygote.pid, signal.SIGKILL)
    for zygote in zygotes:
        zygote.close(sweep=False)


def adopt(cookie: str) -> None:
    """In a rank just forked from a zygote: carry ``cookie`` instead of the zygote's, in the
    environment block /proc/PID/environ shows (and forked children copy) and in os.environ
    (what exec'd children get). Raises if the block has no room: the rank must not run
    uncontained."""
    import ctypes

    needle = f"{COOKIE_VAR}=".encode()
    with open("/proc/self/environ", "rb") as f:
        block = b"\0" + f.read()  # every entry, the first included, now follows a NUL
    entry = block.find(b"\0" + needle)  # the entry's offset in the real block
    end = block.find(b"\0", entry + 1) - 1 if entry >= 0 else -1
    room = end - entry - len(needle)
    value = cookie.encode() + b"\0"
    if entry < 0 or room < len(value) - 1:
        raise RuntimeError(f"no room for the world's cookie in this rank's environment block ({room} characters)")
    with open("/proc/self/stat") as f:
        env_start = int(f.read().rsplit(")", 1)[1].split()[47])  # field 50: env_start
    ctypes.memmove(env_start + entry + len(needle), value, len(value))
    os.environ[COOKIE_VAR] = cookie
    with open("/proc/self/environ", "rb") as f:
        if f"{COOKIE_VAR}={cookie}\0".encode() not in f.read():
            raise RuntimeError("the world's cookie did not land in this rank's environment block")


# -- the zygote process --------------------------------------------------------------------

def zygote_main(supervisor_pid: int, listener_fd: int, alive_r: int, ready_w: int, modules: list[str],
                path: list[str], env: dict[str, str] | None = None) -> None:
    """The zygote: die with the supervisor, import, say ready, then serve fork requests
    (multiprocessing's forkserver loop) until the supervisor is gone or the world is reaped.
    ``env`` is set before the imports (``_caches``); a rank then applies its world's own."""
    die_with_parent(supervisor_pid)
    os.environ.update(env or {})
    sys.path[:] = path
    for module in modules:
        try:
            __import__(module)
        except Exception:  # noqa: BLE001 - the rank imports it again and reports the error
            pass
    os.register_at_fork(after_in_child=_reseed)
    os.write(ready_w, b"1")
    os.close(ready_w)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    forkserver.main(listener_fd, alive_r, [])


def _reseed() -> None:
    """In a forked rank: what an exec'd process would have seeded afresh. ``random`` reseeds
    itself at fork; NumPy's global generator and torch's default CPU generator (seeded from
    the OS at import in this torch) were seeded in the zygote, and are reseeded from the OS."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        try:
            numpy.random.seed()
        except Exception:  # noqa: BLE001 - a broken numpy is the rank's to report
            pass
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.default_generator.seed()  # the CPU generator only: nothing touches CUDA here
