"""A rank's garbage collected between calls, when a call left memory behind.

A check's rank-side run builds a model, wraps it in DDP, attaches hooks and instruments whose
closures point back at the run: a reference cycle, which CPython frees only at a full
(generation 2) collection, and that comes after many allocations of Python objects, not of
bytes. A persistent rank then carried each finished check's model, gradients and DDP buckets
into the next check (measured on a 34 M-parameter MLP: 390 MiB, three copies of the model,
still resident after gradient-equivalence returned; the next check's peak stood on top of
it). On a GPU the same cycle holds device memory.

So after a call, once its result is sent (off the call's clock, while the supervisor reads
it), the rank collects when its RSS, or the device memory its CUDA caching allocator reserves,
grew by :data:`GROWTH` since the last collection: a full collection costs ~25 ms with torch
imported, worth it only after a call that held real memory, and never on the many small calls
(a barrier, a probe) that leave nothing behind. On CUDA the allocator's cache is then handed
back to the driver (``torch.cuda.empty_cache``): the 1-rank reference runs on the first device
of the N-rank world, and a finished call's cached blocks, kept reserved for a process that
will not need them until its next check, would sit on the device under the other process's
peak (docs/memory.md, "Where the reference runs").
"""

from __future__ import annotations

import gc
import sys
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


def _device_reserved() -> int:
    """Bytes the CUDA caching allocator holds on this process's device (0 off CUDA: never
    initialises CUDA itself)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return 0
    return int(torch.cuda.memory_reserved())


@dataclass
class Collector:
    """``after_call()`` once per served call, after every reference to its values is dropped."""

    rss: int | None = None  # this process's RSS after its last collection
    reserved: int = 0  # device memory reserved after its last collection

    def __post_init__(self) -> None:
        self.rss, self.reserved = _rss(), _device_reserved()

    def after_call(self) -> bool:
        """Collect if the call left :data:`GROWTH` behind on the host or the device (or RSS
        cannot be read); True when it did."""
        now = _rss()
        host = now is None or self.rss is None or now >= self.rss + GROWTH
        if not host and _device_reserved() < self.reserved + GROWTH:
            return False
        gc.collect()
        if _device_reserved():
            import torch

            torch.cuda.empty_cache()
        self.rss, self.reserved = _rss(), _device_reserved()
        return True
