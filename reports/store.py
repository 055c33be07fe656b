"""The results store: a report directory that is valid after every single write.

Layout of ``DIR``:
- ``run.json``      written when the run starts (run id, target, backend, world size,
                    environment), rewritten with ``finished`` when it ends normally;
- ``results.jsonl`` one line per finished check or recorded event, appended as they happen,
                    each stamped with the run id;
- ``.lock``         held (flock) by the one run that owns the directory, holding its pid.

The directory is not trusted (docs/report-dir.md, ``reports.trust``): a dir other users can
write is refused, no link in it is followed, and no file is truncated in place (results.jsonl
is replaced by an empty one at the start). The store also keeps in memory what it wrote
(:meth:`ResultStore.written`): the run's own report and exit code come from that, never from
the files, which anyone who can write the dir could have changed by then.

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
from .trust import check_dir, open_file, read_bytes

RESULTS = "results.jsonl"
RUN = "run.json"
LOCK = ".lock"
RUN_ID = "run_id"
REPORT_JSON, REPORT_MD, REPORT_HTML = "report.json", "report.md", "report.html"
#: Every name the run writes in the dir: each must be absent or the dir's own regular file.
OWN_FILES = (LOCK, RUN, RESULTS, REPORT_JSON, REPORT_MD, REPORT_HTML)

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


def _decode(line: bytes) -> str:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8: byte 0x{line[exc.start]:02x} at column {exc.start + 1}") from None


def _json_text(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n"


def _item_from_json(data: dict[str, Any]) -> CheckRecord | Event:
    return Event.from_json(data) if data.get("record") == "event" else CheckRecord.from_json(data)


class ResultStore:
    """Append-only writer and reader of one report directory."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)
        self.run_id: str | None = None
        # What this process wrote, exactly as a reader of the files would parse it back.
        self._meta: dict[str, Any] | None = None
        self._items: list[CheckRecord | Event] = []

    @property
    def results_path(self) -> Path:
        return self.dir / RESULTS

    @property
    def run_path(self) -> Path:
        return self.dir / RUN

    def lock(self) -> str | None:
        """Own the directory for this process's lifetime; ReportDirBusy if another run does.

        Two runs on one directory would interleave their records and truncate each other's
        results. flock, not a pid file: the kernel releases it when the owner dies, even by
        SIGKILL, so a crashed run never leaves the directory locked.

        Raises ``UntrustedReportDir`` (an OSError, one line) for a dir other users can write or
        a link planted at one of its names; returns a warning line for a group-writable dir.
        """
        key = os.path.realpath(self.dir)
        if key in _HELD:
            return None
        self.dir.mkdir(parents=True, exist_ok=True)
        # After mkdir: a dir someone else created first under this name is theirs, and refused.
        warning = check_dir(self.dir, OWN_FILES)
        fd = open_file(self.dir / LOCK, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise ReportDirBusy(f"report dir {str(self.dir)!r} is in use by another run (pid {owner}); "
                                f"wait for it to finish or pass another --report-dir") from None
        # open_file proved the descriptor is the dir's own lock file (regular, one link, ours,
        # reached without a link): rewriting it cannot reach any other file.
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        _HELD[key] = fd
        return warning

    def start(self, meta: dict[str, Any]) -> None:
        """Begin a run: record what is being run, and where, then empty the old results.

        The run id (``meta["run_id"]``, or a new one) goes into run.json and onto every line
        appended afterwards.
        """
        self.dir.mkdir(parents=True, exist_ok=True)
        self.run_id = str(meta.get(RUN_ID) or new_run_id())
        # run.json first: once it names this run, no line of an older run reads as ours, even
        # if emptying results.jsonl fails below (a full disk, a directory in its place).
        self._write_meta({**meta, RUN_ID: self.run_id, "started": meta.get("started", time.time()),
                          "finished": None})
        self._items = []
        # Replaced, not truncated: a link planted at the name is replaced, never followed.
        atomic_write_text(self.results_path, "")

    def finish(self, **extra: Any) -> None:
        self._write_meta({**self._current_meta(), **extra, "finished": time.time()})

    def update_meta(self, **extra: Any) -> None:
        self._write_meta({**self._current_meta(), **extra})

    def _current_meta(self) -> dict[str, Any]:
        return dict(self._meta) if self._meta is not None else self.run_meta()

    def _write_meta(self, meta: dict[str, Any]) -> None:
        text = _json_text(meta)
        atomic_write_text(self.run_path, text)
        self._meta = json.loads(text)

    def append(self, item: CheckRecord | Event) -> None:
        if self.run_id is None:
            self.run_id = self.run_meta().get(RUN_ID)
        data = item.to_json()
        if self.run_id:
            data[RUN_ID] = self.run_id
        line = json.dumps(data, sort_keys=True, allow_nan=False) + "\n"
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = open_file(self.results_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        self._items.append(_item_from_json(json.loads(line)))

    def written(self) -> tuple[dict[str, Any], list[CheckRecord], list[Event]]:
        """This run's metadata, records and events as this process wrote them: what its own
        report and exit code are made of, whatever the files in the dir say by then."""
        if self._meta is None:
            raise RuntimeError(f"no run was started in {str(self.dir)!r} by this store; call start() first")
        records = [item for item in self._items if isinstance(item, CheckRecord)]
        events = [item for item in self._items if isinstance(item, Event)]
        return dict(self._meta), records, events

    def run_meta(self) -> dict[str, Any]:
        """run.json as the dir holds it now (``report DIR``); a run's own is :meth:`written`."""
        try:
            data = json.loads(read_bytes(self.run_path))
        except FileNotFoundError:
            return {}
        return data if isinstance(data, dict) else {}

    def read(self) -> tuple[list[CheckRecord], list[Event]]:
        """This run's records and events: every complete line stamped with run.json's run id.

        A torn last line (a writer killed mid-write) is skipped; a line of another run is
        skipped; any other unreadable line (not UTF-8 included: the dir is not trusted, its
        bytes can be anything) becomes an inconclusive ``harness`` record saying which line
        and why.
        """
        records: list[CheckRecord] = []
        events: list[Event] = []
        try:
            raw = read_bytes(self.results_path)
        except FileNotFoundError:
            return records, events
        try:
            run_id = self.run_meta().get(RUN_ID)
        except ValueError:
            run_id = None
        lines = raw.split(b"\n")
        for number, raw_line in enumerate(lines, 1):
            if not raw_line.strip():
                continue
            torn = number == len(lines)  # no newline after it: a write that did not finish
            try:
                line = _decode(raw_line)
                data = json.loads(line, parse_constant=_reject_constant)
                if not isinstance(data, dict):
                    raise ValueError(f"a JSON {type(data).__name__}, not an object")
                if data.get(RUN_ID, run_id) != run_id:
                    continue  # another run's line (an older run's, or a concurrent writer's)
                item = _item_from_json(data)
                if isinstance(item, Event):
                    events.append(item)
                else:
                    records.append(item)
            except (ValueError, TypeError, AttributeError) as exc:
                if torn:
                    continue
                records.append(CheckRecord(
                    id=f"results.jsonl:{number}", title="Unreadable result line", kind="harness",
                    status="inconclusive", duration_s=0.0,
                    message=f"{RESULTS} line {number} is unreadable ({exc}); its check cannot be "
                            f"counted, so the run is inconclusive: re-run the suite"))
        return records, events
