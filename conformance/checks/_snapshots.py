"""Snapshots of the single-process reference on disk: written once, read tensor by tensor.

The equivalence checks compare every rank's tensors with the reference's *on the rank*: only
summaries travel to the supervisor, whose memory then stays flat in the model size. The
reference's tensors reach the ranks through files in the check's private temp dir
(``ctx.tmpdir``), never through the supervisor's pipes.

Layout: ``<dir>/<label>/<i>.pt`` holds one tensor (``torch.save`` of a compact copy: a
gradient that is a view into a DDP bucket would otherwise save the whole bucket), and
``<dir>/<label>/index.json`` lists ``[name, file or null]`` in model order (null: no
gradient). The index is written last and renamed into place, so a reader never sees a half
written snapshot. One tensor at a time is in memory on either side: the writer's copy of the
tensor it is saving, the reader's tensor it is comparing (memory-mapped from the page cache).

Functions here run inside rank processes; torch is imported lazily.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ._compare import Compared, compare_tensor

INDEX = "index.json"


def write_snapshot(directory: Path, label: str, named: Iterable[tuple[str, Any]]) -> dict[str, float | None]:
    """Write every (name, tensor or None) to ``directory/label``; returns each tensor's norm
    (None where there is none): the reference's norms that the judges need travel as floats."""
    import torch

    folder = directory / label
    folder.mkdir(parents=True, exist_ok=True)
    index: list[tuple[str, str | None]] = []
    norms: dict[str, float | None] = {}
    for i, (name, tensor) in enumerate(named):
        if tensor is None:
            index.append((name, None))
            norms[name] = None
            continue
        copy = tensor.detach().cpu()
        if copy.untyped_storage().nbytes() != copy.numel() * copy.element_size() or not copy.is_contiguous():
            copy = copy.clone()  # a view (of a DDP bucket): saving it would save the whole storage
        torch.save(copy, folder / f"{i}.pt")
        norms[name] = (float(torch.linalg.vector_norm(copy, dtype=torch.float64))
                       if copy.is_floating_point() else None)
        index.append((name, f"{i}.pt"))
        del copy
    partial = folder / (INDEX + ".part")
    partial.write_text(json.dumps(index))
    os.replace(partial, folder / INDEX)
    return norms


def has_snapshot(directory: Path, label: str) -> bool:
    return (directory / label / INDEX).exists()


def read_snapshot(directory: Path, label: str, device: Any) -> Iterator[tuple[str, Any]]:
    """(name, tensor on ``device`` or None) one at a time, in the order written. A missing
    snapshot yields nothing (the reference never reached that point)."""
    import torch

    folder = directory / label
    if not (folder / INDEX).exists():
        return
    for name, file in json.loads((folder / INDEX).read_text()):
        if file is None:
            yield name, None
            continue
        # mmap: the file's pages are read as the comparison touches them, not copied first.
        tensor = torch.load(folder / file, map_location="cpu", mmap=True, weights_only=True)
        yield name, tensor.to(device)


def compare_snapshot(named: list[tuple[str, Any]], snapshots: Path, label: str, device: Any,
                     *, grad: bool) -> list[Compared]:
    """This rank's live tensors against the reference's snapshot ``label``, one at a time.

    Every name of either side is compared (reference order first): a name missing on one side
    is reported as such, and a name without a gradient on both sides is "no gradient on either
    side". The reference's tensor is dropped before the next one is read.
    """
    mine = dict(named)
    out: list[Compared] = []
    for name, ref in read_snapshot(snapshots, label, device):
        out.append(compare_tensor(name, mine.pop(name, None), ref, grad=grad))
        del ref
    out += [compare_tensor(name, got, None, grad=grad) for name, got in mine.items()]
    return out
