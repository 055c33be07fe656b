"""Replace a file atomically: a reader sees the old content or the new, never a half file.

Used for every file of a report directory that is rewritten rather than appended
(``run.json`` by the store; ``report.json``, ``report.md`` and ``report.html`` by the
renderer), so a CI job that uploads artifacts while a run is still writing never ships half a
report.
"""

from __future__ import annotations

import os
from pathlib import Path


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` through a temporary file beside it and ``os.replace``.

    The temporary file is fsynced before the rename, so after a crash the name points at a
    complete file; if writing fails (a full disk, a read-only directory) the temporary file is
    removed and the error propagates, with ``path`` untouched.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)  # atomic on POSIX: same directory, same filesystem
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
