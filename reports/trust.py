"""The report dir is not trusted (docs/report-dir.md): who may write it, and how its files are
opened so that nothing planted in it is ever followed.

A report dir is often a shared place (``/tmp/report``, a CI workspace) and the run often root.
Whoever else can write the dir can plant ``.lock`` or ``results.jsonl`` as a link to any file;
a run that opened them by name would truncate that file and write into it. So:

- a dir owned by another user, or writable by every user without the sticky bit, is refused
  (:class:`UntrustedReportDir`, one line); one its group can write gets a warning, because
  nothing the run decides is read back from it (the exit code comes from memory);
- every file of the dir is opened with ``O_NOFOLLOW`` and checked on the open descriptor
  (a regular file, one link, owned by this user or root) before a byte is written or read;
- files are replaced, never truncated in place (``reports.atomic``), so a link at the name is
  replaced, not followed, and a hard link's other name keeps its content.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path


class UntrustedReportDir(OSError):
    """The report dir, or a file in it, could have been changed by another user; the message
    is one line saying what was found and how to fix it."""


def _trusted(uid: int) -> bool:
    # Root may own the dir: root can rewrite any file anyway, so it adds no one who could not.
    return uid in (os.geteuid(), 0)


def check_dir(directory: Path, names: Iterable[str]) -> str | None:
    """Refuse ``directory`` if another user could change the run's files in it; return a
    warning line if its group (or, with the sticky bit, every user) can add files to it.

    ``names`` are the files the run writes there: each must be absent or a regular file of
    this user's with one link (see :func:`check_file`).
    """
    info = os.stat(directory)  # the dir the user named; a link *to* it is the user's own choice
    mode = stat.S_IMODE(info.st_mode)
    where = f"report dir {str(directory)!r}"
    if not _trusted(info.st_uid):
        raise UntrustedReportDir(f"{where} is owned by uid {info.st_uid}, not by this user (uid {os.geteuid()}): "
                                 f"its owner could change the report under the run; pass a directory of your "
                                 f"own (a new one is created for you)")
    if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
        raise UntrustedReportDir(f"{where} is writable by every user (mode {mode:04o}, no sticky bit): anyone "
                                 f"could plant links or replace the report; chmod o-w it (or chmod +t) or pass "
                                 f"another --report-dir")
    for name in names:
        check_file(directory / name)
    if mode & stat.S_IWOTH:
        return (f"{where} is writable by every user (mode {mode:04o}, sticky bit): others can add files to "
                f"it, which the run refuses to follow or truncate; nothing the run decides is read back "
                f"from it (use a dir of your own to silence this)")
    if mode & stat.S_IWGRP:
        return (f"{where} is writable by its group (mode {mode:04o}): its members can change the report "
                f"files after the run; nothing the run decides is read back from them (chmod g-w to "
                f"silence this)")
    return None


def check_file(path: Path) -> None:
    """Raise :class:`UntrustedReportDir` unless ``path`` is absent or a regular file of this
    user's (or root's) with one link."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    _refuse(path, info)


def _refuse(path: Path, info: os.stat_result) -> None:
    fix = "remove it or pass another --report-dir"
    if stat.S_ISLNK(info.st_mode):
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        raise UntrustedReportDir(f"{path} is a symbolic link (to {target!r}); the run never follows a link "
                                 f"in its report dir (whoever planted it could aim it at any file): {fix}")
    if not stat.S_ISREG(info.st_mode):
        raise UntrustedReportDir(f"{path} is not a regular file; {fix}")
    if info.st_nlink != 1:
        raise UntrustedReportDir(f"{path} has {info.st_nlink} links (a hard link to another file?); the run "
                                 f"never writes a file that has other names: {fix}")
    if not _trusted(info.st_uid):
        raise UntrustedReportDir(f"{path} is owned by uid {info.st_uid}, not by this user "
                                 f"(uid {os.geteuid()}); {fix}")


def open_file(path: Path, flags: int, mode: int = 0o644) -> int:
    """``os.open`` that never follows a link at ``path`` and returns a descriptor only of a
    file :func:`check_file` accepts (checked on the descriptor: no race with a swap)."""
    try:
        # O_NONBLOCK: a FIFO planted at the name would block an open for writing forever.
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, mode)
    except OSError:
        check_file(path)  # a link or a FIFO at the name: say that, not ELOOP/ENXIO
        raise
    try:
        _refuse(path, os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bytes(path: Path) -> bytes:
    """The bytes of ``path``, opened as :func:`open_file` does (FileNotFoundError if absent)."""
    fd = open_file(path, os.O_RDONLY)
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
