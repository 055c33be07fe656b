"""Rank side: a model's tensors kept in files beside the check, not in memory.

    keep(folder, list(module.parameters()))     # each tensor's bytes to its own file
    restore(folder, list(module.parameters()))  # ... and back, in place
    max(max_diffs(folder, list(model.parameters())), default=0.0)

bucket-config's mismatch reproduction trains one model twice from one start and compares the
two runs' final parameters. A copy of the model held in memory while the second run trains
would be one model more on a rank whose training step holds three (parameters, gradients,
buckets; docs/memory.md, "What was found, and fixed"). One tensor is in memory at a time;
files are read back memory-mapped, a tensor's pages at a time.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any


def keep(folder: Path, params: list[Any]) -> None:
    """Each parameter's bytes to its own file in ``folder`` (one tensor in memory at a time)."""
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    for i, p in enumerate(params):
        # Raw bytes (a uint8 view): numpy has no bfloat16.
        p.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tofile(folder / f"{i}.bin")


def restore(folder: Path, tensors: list[Any]) -> None:
    """Each tensor's bytes back from its file in ``folder`` (written by :func:`keep`), in place."""
    import numpy as np
    import torch

    with torch.no_grad():
        for i, t in enumerate(tensors):
            if t.numel():
                raw = torch.from_numpy(np.memmap(folder / f"{i}.bin", dtype=np.uint8, mode="c"))
                t.copy_(raw.view(t.dtype).reshape(t.shape))


def max_diffs(folder: Path, params: list[Any]) -> Iterator[float]:
    """The largest |difference| of each parameter from its kept file, read back one at a time
    (memory-mapped: a tensor's pages, not a copy of the model)."""
    import numpy as np
    import torch

    for i, p in enumerate(params):
        live = p.detach().cpu().reshape(-1)
        if not live.numel():
            yield 0.0
            continue
        kept = torch.from_numpy(np.memmap(folder / f"{i}.bin", dtype=np.uint8, mode="c")).view(live.dtype)
        yield float((live.float() - kept.float()).abs().max())
        del kept
