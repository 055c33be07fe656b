"""The host ran out of something: a full disk, a full ``/dev/shm``, too few file descriptors.

None of these is the target's bug or a DDP finding (docs/architecture.md, "Results": the
environment is not the user's bug). A check that hits one is *inconclusive*, its record
carrying one line that names the resource and the fix (evidence
:data:`reports.keys.EXHAUSTED`); the verdict puts that line first, so the CLI's verdict line
says it. Too few file descriptors is also checked before anything starts (:func:`open_files`):
below the suite's need the run stops with exit 2, a setting the user can fix.

An error is recognised by its errno, from an ``OSError`` or from the text a rank sent back
(``[Errno 28]``, ``OSError(28, ...)``, or the C library's message, which torch's own errors
quote: "unable to write to file </torch_…>: No space left on device (28)").
"""

from __future__ import annotations

import errno
import os
import re

#: errno -> (the resource, how to get more of it).
RESOURCES: dict[int, tuple[str, str]] = {
    errno.ENOSPC: ("disk space (or inodes)",
                   "free space there, or point TMPDIR at a file system with room for several "
                   "copies of the model (DDP_CONFORMANCE_SHM=off keeps snapshots out of /dev/shm)"),
    errno.EDQUOT: ("disk quota", "free space in your quota, or point TMPDIR at another file system"),
    errno.EMFILE: ("open file descriptors (ulimit -n)", "raise the limit, e.g. ulimit -n 4096"),
    errno.ENFILE: ("the system's open-file table", "close other programs' files, or raise "
                   "fs.file-max"),
}
_ERRNO = re.compile(r"\[Errno (\d+)\]|OSError\((\d+),")
_PATH = re.compile(r"(/[^\s'\":,)]+)")

#: File descriptors the supervisor needs besides each rank's: pytest, torch's imports, the
#: store's sockets, the report's files. Measured: 2 gloo ranks start with a limit of 64 and
#: abort (SIGABRT in the store's C++) with 16.
BASE_OPEN_FILES = 256
PER_RANK_OPEN_FILES = 32


def exhausted(error: BaseException | str) -> str | None:
    """One line naming the resource that ran out and the fix, or None when ``error`` is not
    the environment running out of something."""
    code = getattr(error, "errno", None) if isinstance(error, BaseException) else None
    text = str(error)
    if code not in RESOURCES:
        code = next((c for c, _ in RESOURCES.items() if os.strerror(c) in text), None)
    if code is None:
        for match in _ERRNO.finditer(text):
            number = int(next(g for g in match.groups() if g))
            if number in RESOURCES:
                code = number
                break
    if code is None:
        return None
    resource, fix = RESOURCES[code]
    paths = [p for p in _PATH.findall(text) if not p.startswith("/torch_")]
    where = f" writing {paths[0]}" if paths and code in (errno.ENOSPC, errno.EDQUOT) else ""
    shm = " (/dev/shm: memory)" if paths and paths[0].startswith("/dev/shm") else ""
    return (f"the host ran out of {resource}{where}{shm} ({os.strerror(code)}): the environment, "
            f"not the target; {fix}, and run again")


def open_files_needed(world_size: int) -> int:
    return BASE_OPEN_FILES + PER_RANK_OPEN_FILES * world_size


def open_files(world_size: int) -> str | None:
    """Make the soft open-file limit at least what ``world_size`` ranks need, raising it up to
    the hard limit; the reason it cannot be (a hard limit too low), or None.

    Below the need the run dies far from the cause: ``ulimit -n 16`` aborted the supervisor
    in the rendezvous store's C++ (SIGABRT, no message)."""
    try:
        import resource
    except ImportError:  # not POSIX: nothing to check
        return None
    need = open_files_needed(world_size)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return None
    if hard == resource.RLIM_INFINITY or hard >= need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
        return None
    return (f"the open-file limit is {hard} (ulimit -n), below the {need} that {world_size} "
            f"rank(s) and the supervisor need; raise it (ulimit -n 4096) or run fewer ranks")
