"""Containment: every process a rank starts dies with the run, whatever the supervisor's fate.

How, and why this way:
- **A cookie in the environment.** Every rank is exec'd with ``DDP_CONFORMANCE_COOKIE=<value>``
  in its environment; every process it starts inherits it (fork copies the environment block,
  exec passes it on), including children that call ``setsid`` or double-fork to leave the
  rank's process group. ``reap(cookie)`` finds them in ``/proc/*/environ`` and kills them.
  This is Jenkins' ProcessTreeKiller technique. It was chosen over the alternatives because:
  a process group misses ``setsid`` children; ``PR_SET_CHILD_SUBREAPER`` only keeps orphans
  while the supervisor lives, so it cannot help after the supervisor's SIGKILL; a cgroup
  needs delegation that containers and CI runners rarely grant. A process that scrubs its own
  environment escapes the cookie; nothing short of a cgroup catches that.
- **A guardian.** A tiny stdlib-only process (this very file run as a script), started once per supervisor
  process in its own session (Ctrl-C in a terminal does not reach it), holds the read end of
  a pipe. The supervisor registers each world's cookie and temp dirs on it. When the pipe
  reaches EOF — the supervisor exited, normally or by SIGKILL — the guardian reaps every
  registered cookie, removes every registered path and exits. This is what covers SIGKILL of
  the supervisor, which runs no code of its own.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Iterator

COOKIE_VAR = "DDP_CONFORMANCE_COOKIE"
#: How long ``reap`` keeps sweeping for processes that a dying process forked while it was
#: being killed. Each sweep is a few milliseconds; a second is far more than a fork takes.
REAP_SWEEP_S = 1.0

# This module imports nothing but the standard library, so it runs as the guardian script.
_GUARDIAN_SCRIPT = Path(__file__)


def new_cookie() -> str:
    """A value no other run (and no other world of this run) shares."""
    return f"{os.getpid()}-{uuid.uuid4().hex[:12]}"


def marked_pids(cookie: str) -> list[int]:
    """Pids of live processes whose environment carries ``cookie`` (never this process).

    A zombie has an empty environ and is not listed: it is already dead.
    """
    needle = f"{COOKIE_VAR}={cookie}\0".encode()
    own = os.getpid()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == own:
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read() + b"\0":
                    found.append(int(entry))
        except OSError:  # gone meanwhile, or another user's process
            continue
    return found


def reap(cookie: str, *, sweep_s: float = REAP_SWEEP_S) -> int:
    """SIGKILL every process carrying ``cookie`` until none is left (or ``sweep_s`` passed).

    Repeated because a process can fork between the listing and its kill. Returns how many
    processes were killed.
    """
    killed = 0
    until = time.monotonic() + sweep_s
    while True:
        pids = marked_pids(cookie)
        if not pids:
            return killed
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
        if time.monotonic() >= until:
            return killed
        time.sleep(0.005)


@contextmanager
def cookie_in_environment(cookie: str) -> Iterator[None]:
    """Put ``cookie`` into ``os.environ`` while processes are started, then take it out.

    Spawned ranks are exec'd with the supervisor's environment at that moment, so the cookie
    lands in their initial environment block (what /proc shows, what fork copies). It is
    removed again so that the supervisor's own later children (a CLI run inside a test, the
    guardian) are not mistaken for the world's.
    """
    previous = os.environ.get(COOKIE_VAR)
    os.environ[COOKIE_VAR] = cookie
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(COOKIE_VAR, None)
        else:
            os.environ[COOKIE_VAR] = previous


class Guardian:
    """The supervisor's side of the guardian process (one per supervisor process)."""

    def __init__(self) -> None:
        env = {k: v for k, v in os.environ.items() if k != COOKIE_VAR}
        # -I -S: isolated, no site: starts in ~20 ms and imports nothing of the project.
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-S", str(_GUARDIAN_SCRIPT), str(os.getpid())],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, env=env, start_new_session=True,
            close_fds=True)
        assert self._proc.stdin is not None
        self._pipe: IO[bytes] = self._proc.stdin
        self._lock = threading.Lock()

    @property
    def pid(self) -> int:
        return self._proc.pid

    def _say(self, line: str) -> None:
        with self._lock:
            try:
                self._pipe.write((line + "\n").encode())
                self._pipe.flush()
            except (OSError, ValueError):  # the guardian died: the supervisor's own paths still work
                pass

    def watch(self, *, cookie: str | None = None, path: str | None = None) -> None:
        if cookie:
            self._say(f"+cookie {cookie}")
        if path:
            self._say(f"+path {path}")

    def forget(self, *, cookie: str | None = None, path: str | None = None) -> None:
        if cookie:
            self._say(f"-cookie {cookie}")
        if path:
            self._say(f"-path {path}")


_guardian: Guardian | None = None
_guardian_pid: int | None = None


def guardian() -> Guardian:
    """This process's guardian, started on first use (again after a fork)."""
    global _guardian, _guardian_pid
    if _guardian is None or _guardian_pid != os.getpid():
        _guardian, _guardian_pid = Guardian(), os.getpid()
    return _guardian


def _guardian_main() -> None:
    """The guardian process: remember what to clean; clean it when the supervisor is gone."""
    import shutil

    # Ctrl-C and SIGTERM aimed at the run must not stop the guardian before it cleaned up:
    # it ends only at EOF, i.e. when the supervisor process no longer exists.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    cookies: set[str] = set()
    paths: set[str] = set()
    for raw in sys.stdin.buffer:
        op, _, value = raw.decode(errors="replace").rstrip("\n").partition(" ")
        target = cookies if op.endswith("cookie") else paths
        if op.startswith("+"):
            target.add(value)
        else:
            target.discard(value)
    for cookie in cookies:
        reap(cookie)
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def proc_state(pid: int) -> str:
    """The one-letter state of a process from /proc (R, S, D, T, Z...), or "" if unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def process_running(pid: int) -> bool:
    """True when ``pid`` is a live process; a zombie counts as gone (it runs nothing, it only
    waits for its parent to reap it). What "no process left behind" is checked with."""
    return proc_state(pid) not in ("", "Z")


PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """SIGKILL this process when its parent dies (Linux), and exit now if it already has."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except OSError:  # not Linux: the supervisor's kill path still covers us
        pass
    # The parent may have died before prctl took effect; then nobody would ever kill us.
    if os.getppid() != parent_pid:
        os._exit(1)


if __name__ == "__main__":
    _guardian_main()

