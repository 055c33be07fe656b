"""A controlled busy machine: N CPU hogs (and optionally a memory-bandwidth hog) around a block.

A CI gate runs on shared runners; the suite's verdicts and the project's own tests must hold
when other work shares the cores (issue 24). This module makes that load on purpose, the same
way every time, for the tests and benchmarks that show it (``benchmarks/under_load.py``)::

    from conformance.harness.load import busy

    with busy(cpu=2) as load:   # two processes spinning at normal priority
        ...                     # the work measured under load
    load.cpu_s                  # CPU seconds the hogs burned (the load that was applied)

or around any command (the project's test suite under two hogs, README section 'In CI')::

    python -m conformance.harness.load --cpu 2 -- .venv/bin/python -m pytest -n 2

Never left behind: a hog exits after ``limit_s`` whatever happens, when the block ends, and when
its parent dies, even by SIGKILL (Linux ``PR_SET_PDEATHSIG``, and a pipe from the parent whose
end-of-file it watches, for platforms without it). Import-light: no torch, standard library only.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

#: A hog's own time limit: a block that outlives it runs the rest unloaded (the record of the
#: load says so: ``cpu_s`` stops growing), and nothing can keep a hog alive past it.
DEFAULT_LIMIT_S = 3600.0
#: The memory hog copies this many bytes back and forth: far larger than any CPU cache, so
#: every copy goes to memory.
MEMORY_HOG_BYTES = 64 << 20

# The hog's program (run as ``python -c``): die with the parent, then spin until the limit.
_HOG = r"""
import ctypes, os, sys, threading, time
kind, limit, parent = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
try:  # Linux: SIGKILL when the parent dies, whatever the way
    ctypes.CDLL(None, use_errno=True).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
except Exception:
    pass
if os.getppid() != parent:  # the parent died before prctl took effect
    os._exit(0)
def watch():  # any platform: the parent's end of our stdin closes when it exits
    sys.stdin.buffer.read()
    os._exit(0)
threading.Thread(target=watch, daemon=True).start()
end = time.monotonic() + limit
if kind == "memory":
    a, b = bytearray(MEMORY), bytearray(MEMORY)
    while time.monotonic() < end:
        a[:] = b
        b[:] = a
else:
    while time.monotonic() < end:
        for _ in range(200000):
            pass
os._exit(0)
""".replace("MEMORY", str(MEMORY_HOG_BYTES))


@dataclass
class Load:
    """The hogs of one :func:`busy` block. ``cpu_s``: CPU seconds they burned so far (read
    while they run, kept after they stop)."""

    cpu: int
    memory: bool
    limit_s: float
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    started: float = 0.0
    ended: float = 0.0
    _burned: float = 0.0

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    @property
    def cpu_s(self) -> float:
        return self._burned + sum(_cpu_seconds(p.pid) for p in self.procs if p.poll() is None)

    def describe(self) -> str:
        """One line for a report: what load was applied and what it burned."""
        held = (self.ended or time.monotonic()) - self.started if self.started else 0.0
        kinds = f"{self.cpu} CPU hog(s)" + (" + 1 memory-bandwidth hog" if self.memory else "")
        return (f"{kinds} at normal priority; {self.cpu_s:.0f} CPU-s burned in {held:.0f} s "
                f"({self.cpu_s / held if held else 0:.2f} cores)")

    def start(self) -> None:
        self.started = time.monotonic()
        kinds = ["cpu"] * self.cpu + (["memory"] if self.memory else [])
        for kind in kinds:
            self.procs.append(subprocess.Popen(
                [sys.executable, "-c", _HOG, kind, str(self.limit_s), str(os.getpid())],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                self._burned += _cpu_seconds(p.pid)
                p.kill()
        for p in self.procs:
            p.wait()
            if p.stdin is not None:
                p.stdin.close()
        self.procs = []
        self.ended = time.monotonic()


@contextmanager
def busy(cpu: int = 2, *, memory: bool = False, limit_s: float = DEFAULT_LIMIT_S) -> Iterator[Load]:
    """``cpu`` CPU hogs (and a memory-bandwidth hog if ``memory``) while the block runs; each
    exits after ``limit_s`` seconds at the latest, and with this process."""
    if cpu < 0 or limit_s <= 0:
        raise ValueError(f"cpu={cpu}, limit_s={limit_s}: need cpu >= 0 and limit_s > 0")
    load = Load(cpu=cpu, memory=memory, limit_s=limit_s)
    try:
        load.start()
        yield load
    finally:
        load.stop()


def contention(sample_s: float = 0.2) -> float:
    """How many times longer CPU work takes on this machine right now than on an idle core:
    wall time over this process's CPU time for ``sample_s`` of spinning (1.0 idle; about 2 when
    every core has one other runnable process). Measured, not guessed: the tests scale their
    deadlines and slacks by it (tests/conftest.py, ``pace``)."""
    wall0, cpu0 = time.perf_counter(), time.process_time()
    while time.process_time() - cpu0 < sample_s:
        for _ in range(10000):
            pass
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return max(1.0, wall / cpu) if cpu > 0 else 1.0


def _cpu_seconds(pid: int) -> float:
    """utime + stime of a live process (Linux /proc; 0 where it cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.harness.load",
                                     description="Run a command with CPU hogs on the machine (issue 24).")
    parser.add_argument("--cpu", type=int, default=2, help="CPU hogs at normal priority (default 2)")
    parser.add_argument("--memory", action="store_true", help="add a memory-bandwidth hog")
    parser.add_argument("--limit", type=float, default=DEFAULT_LIMIT_S, help="seconds a hog lives at most")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the command to run under load")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command: put it after --, e.g. -- .venv/bin/python -m pytest -n 2")
    with busy(args.cpu, memory=args.memory, limit_s=args.limit) as load:
        rc = subprocess.call(command)
        print(f"load: {load.describe()}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    raise SystemExit(main())
