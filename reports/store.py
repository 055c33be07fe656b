"""The results store: a report directory that is valid after every single write.

Layout of ``DIR``:
- ``run.json``      written when the run starts (target, backend, world size, environment),
                    rewritten with ``finished`` when it ends normally;
- ``results.jsonl`` one line per finished check or recorded event, appended as they happen.

Each append is one ``write()`` of a whole line on an ``O_APPEND`` descriptor followed by
``fsync``: a supervisor killed with SIGKILL leaves at most the lines it had written, never a
half line that a reader would choke on (and a reader skips a torn tail anyway).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from .schema import CheckRecord, Event

RESULTS = "results.jsonl"
RUN = "run.json"


def _atomic_write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, allow_nan=False) + "\n")
    os.replace(tmp, path)  # atomic on POSIX: readers see the old or the new file, never half


class ResultStore:
    """Append-only writer and reader of one report directory."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)

    @property
    def results_path(self) -> Path:
        return self.dir / RESULTS

    @property
    def run_path(self) -> Path:
        return self.dir / RUN

    def start(self, meta: dict[str, Any]) -> None:
        """Begin a run: truncate old results and record what is being run, and where."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.results_path.write_text("")
        _atomic_write_json(self.run_path, {**meta, "started": meta.get("started", time.time()), "finished": None})

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
        line = json.dumps(item.to_json(), sort_keys=True, allow_nan=False) + "\n"
        self.dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.results_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line.encode())
            os.fsync(fd)
        finally:
            os.close(fd)

    def run_meta(self) -> dict[str, Any]:
        try:
            return json.loads(self.run_path.read_text())
        except FileNotFoundError:
            return {}

    def read(self) -> tuple[list[CheckRecord], list[Event]]:
        """Every complete line of results.jsonl; a torn or foreign line is skipped."""
        records: list[CheckRecord] = []
        events: list[Event] = []
        try:
            text = self.results_path.read_text()
        except FileNotFoundError:
            return records, events
        for line in text.splitlines():
            try:
                data = json.loads(line)
                if data.get("record") == "event":
                    events.append(Event.from_json(data))
                else:
                    records.append(CheckRecord.from_json(data))
            except (ValueError, TypeError, AttributeError):
                continue
        return records, events
