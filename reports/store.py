"""The results store: a report directory that is valid after every single write.

Layout of ``DIR``:
- ``run.json``      written when the run starts (run id, target, backend, world size,
                    environment), rewritten with ``finished`` when it ends normally;
- ``results.jsonl`` one line per finished check or recorded event, appended as they happen,
                    each stamped with the run id;
- ``.lock``         held (flock) by the one run that owns the directory, holding its pid.

Each append is one ``write()`` of a whole line on an ``O_APPEND`` descriptor followed by
``fsync``: a supervisor killed with SIGKILL leaves at most the lines it had written, never a
half line that a reader would choke on (and a reader skips a torn tail anyway).

The verdict comes from this run only: ``read`` returns only lines stamped with run.json's run
id, so nothing an earlier or a concurrent run left behind can count for this one. A line
that cannot be read (not JSON, NaN, a foreign shape) in the middle of the file becomes a
``harness`` record — the report is then inconclusive, never silently shorter.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

from .atomic import atomic_write_text
from .schema import CheckRecord, Event

RESULTS = "results.jsonl"
RUN = "run.json"
LOCK = ".lock"
RUN_ID = "run_id"

# Locks this process holds, by the report dir's real path: the CLI takes the lock before it
# starts pytest in the same process, and the plugin's writer must not then lock itself out
# (flock locks belong to open file descriptions, not to processes).
_HELD: dict[str, int] = {}


class ReportDirBusy(RuntimeError):
    """Another live run owns the report directory."""


def new_run_id() -> str:
    """A run id: UTC start time, pid and a random suffix (unique, and readable in a listing)."""
    return f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _atomic_write_json(path: Path, data: dict[str, Any]) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n")


class ResultStore:
    """Append-only writer and reader of one report directory."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)
        self.run_id: str | None = None

    @property
    def results_path(self) -> Path:
        return self.dir / RESULTS

    @property
    def run_path(self) -> Path:
        return self.dir / RUN

    def lock(self) -> None:
        """Own the directory for this process's lifetime; ReportDirBusy if another run does.

        Two runs on one directory would interleave their records and truncate each other's
        results. flock, not a pid file: the kernel releases it when the owner dies, even by
        SIGKILL, so a crashed run never leaves the directory locked.
        """
        key = os.path.realpath(self.dir)
        if key in _HELD:
            return
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.dir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise ReportDirBusy(f"report dir {str(self.dir)!r} is in use by another run (pid {owner}); "
                                f"wait for it to finish or pass another --report-dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        _HELD[key] = fd

    def start(self, meta: dict[str, Any]) -> None:
        """Begin a run: record what is being run, and where, then truncate old results.

        The run id (``meta["run_id"]``, or a new one) goes into run.json and onto every line
        appended afterwards.
        """
        self.dir.mkdir(parents=True, exist_ok=True)
        self.run_id = str(meta.get(RUN_ID) or new_run_id())
        # run.json first: once it names this run, no line of an older run reads as ours, even
        # if truncating results.jsonl fails below (a full disk, a directory in its place).
        _atomic_write_json(self.run_path, {**meta, RUN_ID: self.run_id,
                                           "started": meta.get("started", time.time()), "finished": None})
        self.results_path.write_text("")

    def finish(self, **extra: Any) -> None:
        meta = self.run_meta()
        meta.update(extra)
        meta["finished"] = time.time()
        _atomic_write_json(self.run_path, meta)

    def update_meta(self, **extra: Any) -> None:
        meta = self.run_meta()
        meta.update(extra)
        _atomic_write_json(self.run_path, meta)

    def append(self, item: CheckRecord | Event) -> None:
        if self.run_id is None:
            self.run_id = self.run_meta().get(RUN_ID)
        data = item.to_json()
        if self.run_id:
            data[RUN_ID] = self.run_id
        line = json.dumps(data, sort_keys=True, allow_nan=False) + "\n"
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.results_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def run_meta(self) -> dict[str, Any]:
        try:
            data = json.loads(self.run_path.read_text())
        except FileNotFoundError:
            return {}
        return data if isinstance(data, dict) else {}

    def read(self) -> tuple[list[CheckRecord], list[Event]]:
        """This run's records and events: every complete line stamped with run.json's run id.

        A torn last line (a writer killed mid-write) is skipped; a line of another run is
        skipped; any other unreadable line becomes an inconclusive ``harness`` record saying
        which line and why.
        """
        records: list[CheckRecord] = []
        events: list[Event] = []
        try:
            text = self.results_path.read_text()
        except FileNotFoundError:
            return records, events
        try:
            run_id = self.run_meta().get(RUN_ID)
        except ValueError:
            run_id = None
        lines = text.split("\n")
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            torn = number == len(lines)  # no newline after it: a write that did not finish
            try:
                data = json.loads(line, parse_constant=_reject_constant)
                if not isinstance(data, dict):
                    raise ValueError(f"a JSON {type(data).__name__}, not an object")
                if data.get(RUN_ID, run_id) != run_id:
                    continue  # another run's line (an older run's, or a concurrent writer's)
                if data.get("record") == "event":
                    events.append(Event.from_json(data))
                else:
                    records.append(CheckRecord.from_json(data))
            except (ValueError, TypeError, AttributeError) as exc:
                if torn:
                    continue
                records.append(CheckRecord(
                    id=f"results.jsonl:{number}", title="Unreadable result line", kind="harness",
                    status="inconclusive", duration_s=0.0,
                    message=f"{RESULTS} line {number} is unreadable ({exc}); its check cannot be "
                            f"counted, so the run is inconclusive: re-run the suite"))
        return records, events
