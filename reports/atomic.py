"""Replace a file atomically: a reader sees the old content or the new, never a half file.

Used for every file of a report directory that is rewritten rather than appended
(``run.json`` and the emptied ``results.jsonl`` by the store; ``report.json``, ``report.md``
and ``report.html`` by the renderer), so a CI job that uploads artifacts while a run is still
writing never ships half a report. The report dir is not trusted (docs/report-dir.md): the
temporary file gets a fresh random name, created exclusively, and the rename replaces
whatever sits at the name (a planted link included) instead of writing through it.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

#: Report files are read by others (a CI uploader, a reviewer) and written only by the run.
MODE = 0o644


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file beside it and ``os.replace``.

    The temporary file is fsynced before the rename, so after a crash the name points at a
    complete file; if writing fails (a full disk, a read-only directory) the temporary file is
    removed and the error propagates, with ``path`` untouched.
    """
    # mkstemp opens with O_CREAT | O_EXCL: a link planted at a guessable name (the old
    # ".NAME.PID.tmp") would have been written through; a name that exists is never reused.
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with open(fd, "w", encoding="utf-8") as handle:
            os.fchmod(handle.fileno(), MODE)  # mkstemp's 0600 would hide the report from its readers
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)  # atomic on POSIX: same directory, same filesystem
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
