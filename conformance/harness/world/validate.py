"""Validate a target in a child process under the run's deadline.

    validate_target("my_target.py", world_size=2, deadline=60)   # TargetError if it is broken

Validation runs the user's code — importing the file, ``build_model()``, ``make_batch()`` —
and user code can hang (a ``build_model`` that never returns, an import that sleeps). In the
supervisor that would hang the CLI forever; here it runs in a forked child, in its own
session, dying with its parent, and marked with a containment cookie for anything it execs;
once the deadline passes the child and everything it started are killed.

Why fork (the ranks never fork): torch is imported here *before* the fork, so the child starts
in milliseconds instead of paying a second torch import (~2-3 s on a loaded CI host, per run);
the child only builds on the CPU and never touches CUDA, which is what makes fork unsafe.
"""

from __future__ import annotations

import ctypes
import os
import select
import signal
import time

from ..targets import TargetError
from ._containment import COOKIE_VAR, guardian, new_cookie, reap

_PR_SET_PDEATHSIG = 1
_TARGET_ERROR, _CRASH = b"E", b"X"


def validate_target(spec: str, world_size: int, *, deadline: float) -> None:
    """Raise TargetError (one line, with the fix) if ``spec`` is broken or runs past ``deadline``."""
    import torch  # noqa: F401  (before the fork: the child inherits it instead of importing it)

    cookie = new_cookie()
    guardian().watch(cookie=cookie)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read_end)
        _child(spec, world_size, write_end, cookie)
    os.close(write_end)
    report = b""
    try:
        until = time.monotonic() + deadline
        while True:
            left = until - time.monotonic()
            readable, _, _ = select.select([read_end], [], [], max(left, 0.0))
            if not readable:
                raise TargetError(
                    f"the target {spec!r} did not finish loading within the {deadline:g} s deadline "
                    f"(its import, build_model() or make_batch() never returned); make them return, "
                    f"or pass a longer --deadline")
            chunk = os.read(read_end, 65536)
            if not chunk:  # EOF: the child is done (or dead)
                break
            report += chunk
    finally:
        # Whatever happened (done, a timeout, Ctrl-C): the child and all it started die now.
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        reap(cookie)
        _, status = os.waitpid(pid, 0)
        os.close(read_end)
        guardian().forget(cookie=cookie)
    if report.startswith(_TARGET_ERROR):
        raise TargetError(report[1:].decode(errors="replace"))
    if report.startswith(_CRASH):
        raise TargetError(f"loading the target {spec!r} failed: {report[1:].decode(errors='replace')}; "
                          f"run its build_model() and make_batch() in plain Python to see why")
    if os.WIFSIGNALED(status) and not report:
        raise TargetError(f"loading the target {spec!r} crashed the process (killed by "
                          f"{signal.Signals(os.WTERMSIG(status)).name}); run its build_model() and "
                          f"make_batch() in plain Python to see why")


def _child(spec: str, world_size: int, write_end: int, cookie: str) -> None:
    """Load, build and make one batch; write what went wrong (nothing if all is well); exit."""
    code = 0
    try:
        os.setsid()  # its own session: one killpg takes whatever it forks
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except OSError:  # not Linux: the parent's kill path still covers it
            pass
        # Not a terminal's foreground any more, but keep Ctrl-C for the parent to handle.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.environ[COOKIE_VAR] = cookie  # whatever it execs carries the cookie
        import torch

        from ..targets import build_model_checked, load_target, make_batch_checked

        try:
            target = load_target(spec)
            torch.manual_seed(0)
            build_model_checked(target)
            make_batch_checked(target, torch.Generator().manual_seed(0), target.batch_size_for(world_size))
        except TargetError as exc:
            os.write(write_end, _TARGET_ERROR + str(exc).encode(errors="replace"))
        except BaseException as exc:  # anything else the user's code did: say what, in one line
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            os.write(write_end, _CRASH + f"{type(exc).__name__}: {first}".encode(errors="replace"))
    except BaseException:
        code = 70
    finally:
        # os._exit: never run the parent's atexit handlers, pytest state or buffered output twice.
        os._exit(code)
