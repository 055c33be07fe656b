"""Run forked helper processes to the end, or kill them: a test that hangs leaves none behind."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Sequence
from typing import Any


def run_forked(target: Callable[..., Any], args: Sequence[tuple[Any, ...]], *,
               timeout_s: float = 60) -> list[int | None]:
    """One forked process per ``args`` tuple, all started together; their exit codes (None for
    one that had to be killed after ``timeout_s``)."""
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=target, args=a) for a in args]
    for proc in procs:
        proc.start()
    codes: list[int | None] = []
    for proc in procs:
        proc.join(timeout=timeout_s)
        code = proc.exitcode
        if code is None:  # hung: leave nothing behind
            proc.kill()
            proc.join()
        codes.append(code)
    return codes
