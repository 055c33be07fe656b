"""Run ``ddp-conformance`` as a user would — a real subprocess, real signals — and check what
it leaves behind.

Every run gets a tag in its environment (``DDP_TEST_TAG``). Every process it starts inherits
the tag, whatever it does to its process group or session, so "no new process afterwards"
is checked by looking for the tag in ``/proc/*/environ`` (zombies excluded: they are dead,
only not yet collected by a PID 1 that does not reap). Every run gets its own ``TMPDIR``, so
"no leftover temp dir" is a listing of that folder.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..conftest import Pace

ROOT = Path(__file__).resolve().parents[2]
TARGETS = Path(__file__).resolve().parent / "targets"
CLI = [sys.executable, "-m", "conformance"]
TAG = "DDP_TEST_TAG"
#: Every run in the corpus is killed after this long, whatever happens: a hang of the suite
#: itself fails its test instead of hanging the test run.
HARD_LIMIT_S = 120.0


@dataclass(frozen=True)
class Finished:
    code: int
    stdout: str
    stderr: str
    elapsed_s: float
    #: The host's contention measured over the run (tests/conftest.py, Pace): 1.0 when quiet.
    pace: float = 1.0

    def bound(self, seconds: float) -> float:
        """A time bound of ``seconds`` on a quiet host, scaled by this run's measured contention."""
        return seconds * self.pace

    @property
    def error_lines(self) -> list[str]:
        """The lines the CLI itself wrote to stderr (pytest's own output excluded)."""
        return [line for line in self.stderr.splitlines() if line.startswith("ddp-conformance:")]


class Run:
    """One ``ddp-conformance`` subprocess (or another ``command``: pytest with the plugin) with
    its own tag and temp dir, started in ``cwd``."""

    def __init__(self, args: list[str], workdir: Path, *, env: dict[str, str] | None = None,
                 preexec_fn: Callable[[], None] | None = None, cwd: Path = ROOT,
                 command: list[str] = CLI) -> None:
        self.tag = uuid.uuid4().hex
        self.tmp = workdir / f"tmp-{self.tag[:8]}"
        self.tmp.mkdir(parents=True)
        base = dict(os.environ)
        base.pop("PYTEST_XDIST_WORKER", None)  # the launched suite is not an xdist worker
        base.pop("PYTEST_ADDOPTS", None)  # this test run's own (a case may set its own: ``env``)
        full_env = {**base, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
                    TAG: self.tag, "TMPDIR": str(self.tmp),
                    # The session's memory-backed folder too, where leftovers() looks.
                    "DDP_CONFORMANCE_SHM": str(self.tmp), **(env or {})}
        self.pace = Pace()  # measured again when the run ends (wait)
        self.started = time.monotonic()
        self.proc = subprocess.Popen([*command, *args], cwd=cwd, env=full_env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     preexec_fn=preexec_fn)  # e.g. a lower ulimit -n

    @property
    def pid(self) -> int:
        return self.proc.pid

    def signal(self, sig: signal.Signals) -> float:
        os.kill(self.proc.pid, sig)
        return time.monotonic()

    def wait(self, timeout: float = HARD_LIMIT_S) -> Finished:
        timeout = self.pace.bound(timeout)  # a safety net, as loose on a loaded host as the bounds
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill_everything()
            out, err = self.proc.communicate()
            raise AssertionError(f"ddp-conformance did not exit within {timeout:g} s:\n{err[-3000:]}") from None
        elapsed = time.monotonic() - self.started
        return Finished(self.proc.returncode, out, err, elapsed, self.pace.measure())

    def kill_everything(self) -> None:
        """The test's own safety net (never what a test asserts on)."""
        for pid in tagged(self.tag):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def leftovers(self, *, within_s: float = 5.0) -> tuple[list[str], list[str]]:
        """(live processes carrying the tag, temp dirs left) once ``within_s`` has passed
        without them all going away."""
        until = time.monotonic() + self.pace.bound(within_s)
        while True:
            procs = [describe(pid) for pid in tagged(self.tag)]
            # torchinductor_<user>: inductor's cache folder, which torch._dynamo's import creates.
            dirs = sorted(p.name for p in self.tmp.iterdir() if p.name.startswith(("ddp-", "torchinductor_")))
            if (not procs and not dirs) or time.monotonic() >= until:
                if procs:
                    self.kill_everything()
                return procs, dirs
            time.sleep(0.05)


def tagged(tag: str) -> list[int]:
    """Live (non-zombie) processes whose environment carries ``TAG=tag``; never this one."""
    needle = f"{TAG}={tag}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read():
                    continue
            with open(f"/proc/{entry}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
        except (OSError, IndexError):
            continue
        found.append(int(entry))
    return found


def describe(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return str(pid)
    return f"{pid}: {cmdline[:120]}"


def wait_for_files(folder: Path, count: int, *, timeout: float = 60.0) -> list[Path]:
    until = time.monotonic() + timeout
    while time.monotonic() < until:
        files = list(folder.iterdir())
        if len(files) >= count:
            return files
        time.sleep(0.05)
    raise AssertionError(f"{count} file(s) never appeared in {folder}")
