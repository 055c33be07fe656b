"""Load a target in a child process under the run's deadline; the supervisor gets its description.

    info = describe_target("my_target.py", world_size=2, deadline=60)   # TargetError if broken
    info = describe_target("my_target.py", 2, deadline=60, build=False) # import and names only

The supervisor (the CLI's process, the pytest controller) never imports the user's code. An
import runs arbitrary code: it may hang, exit the process (``os._exit(0)`` in a script without
a main guard), start threads or processes, install signal handlers, change the working
directory. Here it runs in a forked child, in its own session, dying with its parent, marked
with a containment cookie for anything it execs; once the child answered, or the deadline
passed, the child and everything it started are killed. The child answers with one framed
message: the target's :class:`TargetInfo` as JSON (never a pickle: nothing the child sends can
run code in the supervisor), a TargetError, or a crash. A child that ends without answering —
whatever its exit status, 0 included, or a signal — is a target error that quotes what the
child printed (its stdout and stderr go to a file for that).

Why fork (the ranks never fork): torch is imported here *before* the fork, so the child starts
in milliseconds instead of paying a second torch import (~2-3 s on a loaded CI host, per run);
the child only builds on the CPU and never touches CUDA, which is what makes fork unsafe.
"""

from __future__ import annotations

import ctypes
import faulthandler
import json
import os
import select
import shutil
import signal
import tempfile
import sys
import time
from typing import IO, Any

from ..target_calls import takes_model
from ..targets import SEE, TargetError, TargetInfo, call_target, default_build_optimizer, optimizer_checked
from ._caches import compile_cache_env
from ._containment import COOKIE_VAR, guardian, new_cookie, reap
from ._launch_env import apply_environment, describing_environment
from ._results import first_line

_PR_SET_PDEATHSIG = 1
_INFO, _TARGET_ERROR, _CRASH, _EXIT = b"R", b"E", b"X", b"S"
#: How much of what the child printed a target error quotes (its last characters).
PRINTED_TAIL = 300

#: Targets described in this process, by spec: the CLI describes (and builds) the target at
#: the edge, and the session it then runs in-process reuses the answer instead of loading the
#: target a second time. Only successes are kept, each with whether it was built.
_DESCRIBED: dict[str, tuple[TargetInfo, bool]] = {}


def describe_target(spec: str, world_size: int, *, deadline: float, build: bool = True,
                    launched: bool = False) -> TargetInfo:
    """The target's description, loaded in a child; with ``build`` also ``build_model()``,
    ``build_optimizer()`` on it (what it returns) and one ``make_batch()``. Raises TargetError
    (one line, with the fix) if ``spec`` is broken, ends its process or runs past ``deadline``.
    The child sees rank 0's torchrun variables of a world of ``world_size``
    (``_launch_env.describing_environment``); ``launched`` (this process is a rank under
    --attach): the launcher's own, inherited as they are."""
    known = _DESCRIBED.get(spec)
    if known is not None and (known[1] or not build):
        return known[0]
    import torch  # noqa: F401  (before the fork: the child inherits it instead of importing it)

    cookie = new_cookie()
    # The child's own folder: a target that imports torch._dynamo (torch.compile) creates
    # inductor's cache folder, which must go with the child (_caches).
    scratch = tempfile.mkdtemp(prefix="ddp-validate-")
    cache = compile_cache_env(scratch)
    guardian().watch(cookie=cookie, path=scratch)
    with tempfile.TemporaryFile() as printed:
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never returns
            os.close(read_end)
            os.environ.update(cache)
            _child(spec, world_size, write_end, cookie, printed.fileno(), build, launched)
        os.close(write_end)
        try:
            answer, status = _await(pid, read_end, cookie, spec, deadline, printed)
        finally:
            os.close(read_end)
            shutil.rmtree(scratch, ignore_errors=True)
            guardian().forget(cookie=cookie, path=scratch)
        info = _judge(spec, answer, status, _tail(printed))
    _DESCRIBED[spec] = (info, build)
    return info


def validate_target(spec: str, world_size: int, *, deadline: float, launched: bool = False) -> TargetInfo:
    """:func:`describe_target` with the build: what the CLI checks at the edge."""
    return describe_target(spec, world_size, deadline=deadline, build=True, launched=launched)


def _await(pid: int, read_end: int, cookie: str, spec: str, deadline: float,
           printed: IO[bytes]) -> tuple[bytes, int]:
    """The child's answer (up to EOF) and its wait status; the child and all it started are
    dead when this returns, whatever happened (done, a timeout, Ctrl-C)."""
    answer = b""
    try:
        until = time.monotonic() + deadline
        while True:
            left = until - time.monotonic()
            readable, _, _ = select.select([read_end], [], [], max(left, 0.0))
            if not readable:
                raise TargetError(
                    f"the target {spec!r} did not finish loading within the {deadline:g} s deadline "
                    f"(its import, build_model(), build_optimizer() or make_batch() never "
                    f"returned){_printed(printed)}; "
                    f"make them return, or pass a longer --deadline")
            chunk = os.read(read_end, 65536)
            if not chunk:  # EOF: the child is done (or dead)
                break
            answer += chunk
    finally:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        reap(cookie)
        _, status = os.waitpid(pid, 0)
    return answer, status


def _judge(spec: str, answer: bytes, status: int, output: str) -> TargetInfo:
    """The child's answer as a TargetInfo, or the TargetError that it (or its silence) means."""
    said = f"; it printed: {output!r}" if output else ""
    if answer.startswith(_INFO):
        try:
            return TargetInfo.from_json(json.loads(answer[1:].decode()))
        except (ValueError, KeyError, TypeError) as exc:  # written over by the user's code
            raise TargetError(f"loading the target {spec!r} garbled the suite's answer "
                              f"({type(exc).__name__}){said}; keep the module's code from writing "
                              f"to inherited file descriptors ({SEE})") from None
    if answer.startswith(_TARGET_ERROR):
        raise TargetError(answer[1:].decode(errors="replace"))
    if answer.startswith(_CRASH):
        raise TargetError(f"loading the target {spec!r} failed: {answer[1:].decode(errors='replace')}"
                          f"{said}; run its build_model() and make_batch() in plain Python to see why")
    if answer.startswith(_EXIT):
        ended = answer[1:].decode(errors="replace")
    elif os.WIFSIGNALED(status):
        ended = f"the process was killed by {signal.Signals(os.WTERMSIG(status)).name}"
    else:
        ended = f"the process exited with status {os.WEXITSTATUS(status)}"
    raise TargetError(f"loading the target {spec!r} ended its process before it could be checked "
                      f"({ended}; nothing was verified){said}; module-level code must "
                      f"not exit or kill the process: put script code under "
                      f"`if __name__ == \"__main__\":` ({SEE})")


def _tail(printed: IO[bytes]) -> str:
    """The last PRINTED_TAIL characters the child wrote, on one line."""
    try:
        printed.seek(0)
        text = printed.read().decode(errors="replace")
    except (OSError, ValueError):
        return ""
    return " | ".join(line.strip() for line in text.strip().splitlines() if line.strip())[-PRINTED_TAIL:]


def _printed(printed: IO[bytes]) -> str:
    output = _tail(printed)
    return f"; it printed: {output!r}" if output else ""


def _child(spec: str, world_size: int, write_end: int, cookie: str, output: int, build: bool,
           launched: bool) -> None:
    """Load (and build, and make one batch); write the answer; exit."""
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
        if not launched:
            # Before the user's module-level code: it reads WORLD_SIZE/LOCAL_RANK as on a rank
            # (a KeyError here would be a false target error), never a stray launcher's values.
            apply_environment(os.environ, describing_environment(os.environ, world_size))
        # One intra-op thread, before any of the user's code: a parent that already ran torch
        # ops (a pytest process, the user's own tests) forked with OpenMP's pool active, and the
        # child's first parallel op would wait forever on threads that were not forked (the
        # reason DataLoader's forked workers do the same). The child only builds on the CPU.
        import torch

        torch.set_num_threads(1)
        faulthandler.disable()  # the parent's (pytest's) fatal-error dump is not the child's to write
        for fd in (1, 2):  # what the user's code prints, quoted if it ends badly
            os.dup2(output, fd)
        # Line-buffered on those descriptors (not pytest's capture streams, nor the parent's
        # unflushed buffers): a line printed before an os._exit() is in the file.
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        os.write(write_end, _answer(spec, world_size, build))
    except BaseException:
        code = 70
    finally:
        # os._exit: never run the parent's atexit handlers, pytest state or buffered output twice;
        # no thread the user's code started can keep the child alive.
        os._exit(code)


def _answer(spec: str, world_size: int, build: bool) -> bytes:
    import torch

    from ..targets import build_model_checked, load_target, make_batch_checked

    try:
        target = load_target(spec)
        if build:
            torch.manual_seed(0)
            model = build_model_checked(target)
            _optimizer_returned(target, model)
            make_batch_checked(target, torch.Generator().manual_seed(0), target.batch_size_for(world_size))
        return _INFO + json.dumps(target.info().to_json()).encode()
    except TargetError as exc:
        return _TARGET_ERROR + str(exc).encode(errors="replace")
    except SystemExit as exc:  # sys.exit() / exit() in module-level code or build_model()
        return _EXIT + f"called sys.exit({exc.code!r})".encode(errors="replace")
    except BaseException as exc:  # anything else the user's code did: say what, in one line
        first = first_line(str(exc).strip())
        return _CRASH + f"{type(exc).__name__}: {first}".encode(errors="replace")


#: What torch says when a call needs a process group: this child has none (a rank has).
NEEDS_A_PROCESS_GROUP = ("process group", "init_process_group")


def _optimizer_returned(target: Any, model: Any) -> None:
    """``build_optimizer`` called and judged before any world starts: what it returns (a None or
    a list: a TargetError), and an exception raised on the user's own line (a parameter named
    as if it got the model: found in a second here, not after a world's start on a rank). What
    needs the process group this child lacks (a ZeroRedundancyOptimizer, ``dist.get_rank()``)
    and whatever is not the user's own line is left to the ranks, which call it again."""
    fn = target.build_optimizer
    if fn is default_build_optimizer:
        return
    try:
        returned = call_target(target, "build_optimizer", fn, model if takes_model(fn) else model.parameters())
    except TargetError as exc:
        if any(words in str(exc.__cause__) for words in NEEDS_A_PROCESS_GROUP):
            return
        raise
    except Exception:  # noqa: BLE001 -- not the user's own line: the ranks judge it with a process group
        return
    optimizer_checked(target, returned)
