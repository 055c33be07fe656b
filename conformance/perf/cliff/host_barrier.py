"""A barrier for the ranks of one host that sends nothing over the network.

The ``scaling-cliff`` check lines its ranks up before every timed step. A ``dist.barrier``
would do it over the very link the check shapes: its packets (and their acknowledgements)
take tokens from the link's bucket just before the step, which no training loop does, so
the step measured would start with less burst than the loop's. The check's ranks always
share a host (the shaped link is a private network namespace on it), so they meet in a small
shared file instead.
"""

from __future__ import annotations

import mmap
import os
import time
from pathlib import Path

_SLOT = 8  # one int64 counter per rank


class HostBarrier:
    """Ranks 0..world_size-1 of one host, meeting through ``path`` (a file every rank can map).

    Every rank counts its arrivals in its own slot; a rank passes the n-th barrier once every
    slot reads at least n. The counters only grow, so nothing is reset between barriers and a
    fast rank cannot lap a slow one. Waiting spins (yielding the CPU): the ranks are released
    within microseconds of each other, where a sleep would add its timer's slack. A rank that
    does not arrive within ``timeout_s`` makes the others raise rather than wait forever.
    """

    def __init__(self, path: Path, rank: int, world_size: int, timeout_s: float) -> None:
        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            size = world_size * _SLOT
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)  # zero-filled; every rank asks for the same size
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._slots = memoryview(self._map).cast("q")
        self._arrivals = self._slots[rank]

    def wait(self) -> None:
        self._arrivals += 1
        self._slots[self.rank] = self._arrivals
        deadline = time.monotonic() + self.timeout_s
        while min(self._slots) < self._arrivals:
            if time.monotonic() > deadline:
                late = [r for r in range(self.world_size) if self._slots[r] < self._arrivals]
                raise TimeoutError(f"host barrier {self._arrivals}: rank(s) {late} did not arrive "
                                   f"within {self.timeout_s:.0f} s")
            os.sched_yield()

    def close(self) -> None:
        self._slots.release()
        self._map.close()
