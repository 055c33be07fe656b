"""A rank's garbage collected between calls, when a call left memory behind.

A check's rank-side run builds a model, wraps it in DDP, attaches hooks and instruments whose
closures point back at the run: a reference cycle, which CPython frees only at a full
(generation 2) collection, and that comes after many allocations of Python objects, not of
bytes. A persistent rank then carried each finished check's model, gradients and DDP buckets
into the next check (measured on a 34 M-parameter MLP: 390 MiB, three copies of the model,
still resident after gradient-equivalence returned; the next check's peak stood on top of
it). On a GPU the same cycle holds device memory.

So after a call, once its result is sent (off the call's clock, while the supervisor reads
it), the rank collects when its RSS grew by :data:`GROWTH` since the last collection: a full
collection costs ~25 ms with torch imported, worth it only after a call that held real memory,
and never on the many small calls (a barrier, a probe) that leave nothing behind.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

#: RSS growth since the last collection that makes one worth its ~25 ms.
GROWTH = 32 << 20


def _rss() -> int | None:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


@dataclass
class Collector:
    """``after_call()`` once per served call, after every reference to its values is dropped."""

    rss: int | None = None  # this process's RSS after its last collection

    def __post_init__(self) -> None:
        self.rss = _rss()

    def after_call(self) -> bool:
        """Collect if the call left :data:`GROWTH` behind (or RSS cannot be read); True when it did."""
        now = _rss()
        if now is not None and self.rss is not None and now < self.rss + GROWTH:
            return False
        gc.collect()
        self.rss = _rss()
        return True
