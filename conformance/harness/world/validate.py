"""Validate a target in a child process under the run's deadline.

    validate_target("my_target.py", world_size=2, deadline=60)   # TargetError if it is broken

Validation runs the user's code — importing the file, ``build_model()``, ``make_batch()`` —
and user code can hang (a ``build_model`` that never returns, an import that sleeps). In the
supervisor that would hang the CLI forever; here it runs in a child, in its own session and
marked with a containment cookie, that is killed with everything it started once the deadline
passes. The deadline starts when the child has imported torch (the interpreter's own start-up
is not the target's time); ``STARTUP_S`` bounds that part.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

from ..targets import TargetError
from ..timing import WORLD_START_S
from ._containment import cookie_in_environment, guardian, new_cookie, reap

ERROR_MARK = "ddp-target-error: "
_ROOT = str(Path(__file__).resolve().parents[3])  # the folder holding the conformance package


def validate_target(spec: str, world_size: int, *, deadline: float) -> None:
    """Raise TargetError (one line, with the fix) if ``spec`` is broken or runs past ``deadline``."""
    cookie = new_cookie()
    guardian().watch(cookie=cookie)
    ready_r, ready_w = os.pipe()
    try:
        with cookie_in_environment(cookie):
            proc = subprocess.Popen(
                [sys.executable, "-c",
                 (f"import sys; sys.path.insert(0, {_ROOT!r}); "
                  f"from conformance.harness.world.validate import _child; _child()"),
                 spec, str(world_size), str(ready_w)],
                stderr=subprocess.PIPE, text=True, pass_fds=(ready_w,), start_new_session=True)
        os.close(ready_w)
        ready_w = -1
        try:
            # Phase 1: interpreter and torch start-up (not the target's time).
            readable, _, _ = select.select([ready_r], [], [], WORLD_START_S)
            started = time.monotonic()
            if not readable:
                raise TargetError(f"validating the target {spec!r} could not start a Python process "
                                  f"with torch within {WORLD_START_S:g} s; the machine is overloaded")
            # Phase 2: the user's code, under the run's deadline.
            _, err = proc.communicate(timeout=max(0.0, deadline - (time.monotonic() - started)))
        except subprocess.TimeoutExpired:
            raise TargetError(
                f"the target {spec!r} did not finish loading within the {deadline:g} s deadline "
                f"(its import, build_model() or make_batch() never returned); make them return, "
                f"or pass a longer --deadline") from None
        finally:
            # Whatever happened (a timeout, Ctrl-C): the child and all it started die now.
            reap(cookie)
            if proc.poll() is None:
                proc.kill()
            proc.wait()
    finally:
        os.close(ready_r)
        if ready_w >= 0:
            os.close(ready_w)
        guardian().forget(cookie=cookie)
    if proc.returncode == 0:
        return
    lines = [line[len(ERROR_MARK):] for line in (err or "").splitlines() if line.startswith(ERROR_MARK)]
    if lines:
        raise TargetError(lines[-1])
    tail = [line for line in (err or "").strip().splitlines() if line.strip()][-1:]
    how = (f"killed by signal {-proc.returncode}" if proc.returncode < 0
           else f"exit code {proc.returncode}")
    raise TargetError(f"loading the target {spec!r} crashed the process ({how})"
                      f"{': ' + tail[0] if tail else ''}; run its build_model() and make_batch() "
                      f"in plain Python to see why")


def _child() -> None:
    """The child's side: load, build and make one batch; report a TargetError on stderr."""
    spec, world_size, ready_fd = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    import torch

    from ..targets import build_model_checked, load_target, make_batch_checked

    os.write(ready_fd, b"started\n")
    os.close(ready_fd)
    try:
        target = load_target(spec)
        torch.manual_seed(0)
        build_model_checked(target)
        size = target.batch_size_for(world_size)
        make_batch_checked(target, torch.Generator().manual_seed(0), size)
    except TargetError as exc:
        print(f"{ERROR_MARK}{exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    sys.stdout.flush()
