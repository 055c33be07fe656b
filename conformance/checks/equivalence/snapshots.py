"""Snapshots of the single-process reference on disk: written once, read tensor by tensor.

The equivalence checks compare every rank's tensors with the reference's *on the rank*: only
summaries travel to the supervisor, whose memory then stays flat in the model size. The
reference's tensors reach the ranks through files in the check's private temp dir
(``ctx.tmpdir``), never through the supervisor's pipes.

Layout: ``<dir>/<label>/<i>.bin`` holds one tensor's raw bytes (of a compact copy: a gradient
that is a view into a DDP bucket would otherwise drag the whole bucket along), and
``<dir>/<label>/index.json`` lists ``[name, file, dtype, shape]`` in model order (file null: no
gradient). Raw bytes rather than ``torch.save``: its zip container computes a CRC of every
byte, which made writing the snapshots the reference's largest cost on a large model. A
tensor that is not a plain strided one (a sparse gradient) is ``torch.save``d to ``<i>.pt``
(dtype null). The index is written last and renamed into place, so a reader never sees a half
written snapshot. One tensor at a time is mapped on the reader's side (from the page cache),
and a comparison drops its pages chunk by chunk: the reader's RSS holds a chunk of it.

Where the bytes go: the snapshots live for seconds (removed as soon as the ranks compared),
so writing them to a disk only spends its bandwidth: past ~1 GB of dirty pages the kernel
throttled the writer to the disk's speed (2 GB of snapshots of a 100 M model: 3.3 s on disk,
0.75 s in memory). With a ``memory`` folder (the session's folder on ``/dev/shm``, see
``conformance/harness/session.py``) a snapshot goes there while it fits in a quarter of the
memory left (``memory_room``), and ``<dir>/<label>`` is a symlink to it, so readers see one
layout; otherwise, or without one, it is written under ``<dir>``.

``SnapshotWriter`` writes in a background thread so that the disk works while the reference
trains (except into memory on a host whose every core already trains, see ``_inline``): it
holds at most one pending snapshot (a copy of the tensors, taken when asked: the live ones
change with the next step), which is the ≤ 1 extra copy of the model the checks may spend per
process. A write error is raised by the next call that touches the writer.

Functions here run inside rank processes; torch is imported lazily.
"""

from __future__ import annotations

import json
import mmap
import os
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ...harness.resources import available_memory
from .tensors import Compared, compare_tensor
from .wide_sums import norm64

INDEX = "index.json"


def _compact(tensor: Any, *, copy: bool) -> Any:
    """A CPU tensor holding exactly ``tensor``'s elements; a fresh copy when ``copy`` (the
    background writer's: the live tensor moves on with the next step)."""
    import torch

    src = tensor.detach()
    out = src.cpu()
    fresh = src.device.type != "cpu"  # .cpu() of a device tensor is a copy already
    if out.layout != torch.strided:
        return out.clone() if copy and not fresh else out
    if ((copy and not fresh) or not out.is_contiguous()
            or out.untyped_storage().nbytes() != out.numel() * out.element_size()):
        # A view (of a DDP bucket): written as is, it would drag the whole storage along.
        out = out.clone(memory_format=torch.contiguous_format)
    return out


def _norm(tensor: Any) -> float | None:
    import torch

    if not tensor.is_floating_point():
        return None
    if tensor.layout != torch.strided:
        tensor = tensor.coalesce().values() if tensor.is_sparse else tensor.to_dense()
    return norm64(tensor)


def _save(folder: Path, i: int, tensor: Any) -> list[Any]:
    """Write one compact CPU tensor; its index entry after the name."""
    import torch

    if tensor.layout != torch.strided:
        torch.save(tensor, folder / f"{i}.pt")
        return [f"{i}.pt", None, list(tensor.shape)]
    file = f"{i}.bin"
    with open(folder / file, "wb") as f:
        if tensor.numel():
            # uint8 view of the same memory: numpy has no bfloat16/float8, bytes are bytes.
            f.write(memoryview(tensor.reshape(-1).view(torch.uint8).numpy()))
    return [file, str(tensor.dtype).removeprefix("torch."), list(tensor.shape)]



#: A snapshot goes to memory when it takes at most this share of the memory left: the
#: training processes on the host keep the rest, and later snapshots of the run still fit.
MEMORY_SHARE = 0.25


def _cgroup_room() -> int | None:
    """Bytes left under this process's cgroup memory limit (v2, then v1); None: no limit.
    A memory-backed file is charged to the cgroup that wrote it: in a container the host's
    MemAvailable overstates what the writer may take."""
    for limit, usage in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                         ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                          "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            cap = Path(limit).read_text().strip()
            if cap == "max" or int(cap) >= 1 << 60:
                return None
            return max(0, int(cap) - int(Path(usage).read_text()))
        except (OSError, ValueError):
            continue
    return None


def memory_room(memory: Path) -> int:
    """Bytes a snapshot may still take in the memory-backed folder ``memory``: the least of
    its file system's free space, the host's available memory and the cgroup's room."""
    try:
        stat = os.statvfs(memory)
    except OSError:
        return 0
    rooms = [stat.f_bavail * stat.f_frsize, available_memory(), _cgroup_room()]
    return min(r for r in rooms if r is not None)


def _nbytes(named: list[tuple[str, Any]]) -> int:
    return sum(t.numel() * t.element_size() for _, t in named if t is not None)


def _home(directory: Path, label: str, nbytes: int, memory: Path | None) -> Path:
    """The folder ``label`` is written to: ``memory/label`` behind a symlink at
    ``directory/label`` when it fits there (see the module's docstring), else
    ``directory/label``. A label written again stays where it first went."""
    link = directory / label
    if link.is_symlink() or link.exists() or memory is None:
        return link
    if nbytes > MEMORY_SHARE * memory_room(memory):
        return link
    target = memory / label
    target.mkdir(parents=True, exist_ok=True)
    directory.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target, target_is_directory=True)
    return link


def _inline(named: list[tuple[str, Any]]) -> bool:
    """Write a memory-backed snapshot in the caller's thread? Yes for CPU tensors when the
    process's compute threads already take every core it may run on (the 1-rank reference on
    a small host): a background writer then only takes turns with the step it was meant to
    overlap, and its staging copy doubles the bytes moved (a 100 M model on 2 cores: the
    reference waited 1.4 s on its writer). A device's tensors (the writer's copy is the
    device-to-host one, overlapping device compute) and a disk (write-back stalls) keep the
    background writer."""
    import torch

    if any(t is not None and t.device.type != "cpu" for _, t in named):
        return False
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return torch.get_num_threads() >= cores


def _write(folder: Path, named: Iterable[tuple[str, Any]], *, copy: bool, measure: bool = True,
           known: dict[str, float | None] | None = None) -> dict[str, float | None]:
    import torch

    folder.mkdir(parents=True, exist_ok=True)
    # A label written again (every clip before the first step overwrites the last): the old
    # index goes first, so the folder never lists files of two writes.
    (folder / INDEX).unlink(missing_ok=True)
    index: list[list[Any]] = []
    norms: dict[str, float | None] = {}
    for i, (name, tensor) in enumerate(named):
        if tensor is None:
            index.append([name, None, None, None])
            norms[name] = None
            continue
        compact = _compact(tensor, copy=copy)
        index.append([name, *_save(folder, i, compact)])
        # A dense tensor's norm measured already (``known``, the same float64 norm) is kept.
        if known is not None and name in known and compact.layout == torch.strided:
            norms[name] = known[name]
        else:
            norms[name] = _norm(compact) if measure else None
        del compact
    partial = folder / (INDEX + ".part")
    partial.write_text(json.dumps(index))
    # The index last, renamed into place: a reader sees a whole snapshot or none.
    os.replace(partial, folder / INDEX)
    return norms


def write_snapshot(directory: Path, label: str, named: Iterable[tuple[str, Any]],
                   *, memory: Path | None = None) -> dict[str, float | None]:
    """Write every (name, tensor or None) to ``directory/label`` now, one tensor at a time;
    returns each tensor's norm (None where there is none): the reference's norms that the
    judges need travel as floats. ``memory``: see the module's docstring."""
    named = list(named)
    return _write(_home(directory, label, _nbytes(named), memory), named, copy=False)


class SnapshotWriter:
    """Snapshots written in a background thread, one pending at a time.

    ``write`` first waits for the pending snapshot (the memory bound: one copy of the model,
    never two), then copies the tensors (the live ones change once the caller moves on) and
    returns; the thread writes them, the index last. ``norms(label)`` and ``close`` wait.
    The copies land in staging buffers kept per tensor name and reused by the next snapshot of
    that name: the same one copy of the model, allocated once instead of once per snapshot (a
    fresh 400 MB allocation page-faults its way in; on a VM that hands idle memory back to the
    host that is slower than the copy itself). ``close`` frees them.
    A write error is kept and raised by the next ``write``, ``norms`` or ``close``: a snapshot
    that failed must fail the run, not leave the ranks comparing against nothing.
    """

    def __init__(self, directory: Path, *, memory: Path | None = None) -> None:
        self.directory = directory
        self.memory = memory
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self._norms: dict[str, dict[str, float | None]] = {}
        self._staging: dict[str, Any] = {}

    def _stage(self, name: str, tensor: Any) -> Any:
        """A copy of ``tensor`` in this name's staging buffer (a new one on first use, or when
        the shape or dtype changed; a sparse tensor is copied afresh each time)."""
        import torch

        src = tensor.detach()
        buf = self._staging.get(name)
        if (buf is not None and src.layout == torch.strided and buf.shape == src.shape
                and buf.dtype == src.dtype):
            return buf.copy_(src)
        out = _compact(src, copy=True)
        if out.layout == torch.strided:
            self._staging[name] = out
        return out

    def _failed(self, error: BaseException) -> RuntimeError:
        return RuntimeError(f"writing the reference's snapshot to {self.directory} failed: "
                            f"{error!r}; the check's temp dir must be writable, with room for "
                            f"several copies of the model")

    def _wait(self) -> None:
        # join() has no deadline on purpose: the thread only writes local files; the check's
        # deadline (enforced by the supervisor on the whole rank) bounds a stuck disk.
        self.settle()
        if self._error is not None:
            error, self._error = self._error, None
            raise self._failed(error) from error

    def write(self, label: str, named: Iterable[tuple[str, Any]], *, norms: bool = True,
              known: dict[str, float | None] | None = None) -> None:
        """Snapshot ``named`` as ``label``; ``norms``: measure each tensor's norm for
        ``norms(label)`` (a pass over the snapshot: only the judged gradients need it), except
        a dense tensor's in ``known`` (its norm, measured by the caller already)."""
        self._wait()
        self._norms.pop(label, None)
        named = list(named)
        try:
            folder = _home(self.directory, label, _nbytes(named), self.memory)
            if folder.is_symlink() and _inline(named):
                # Into memory, from the live tensors, now: one copy, and no thread competing
                # with the training step for cores it already uses (see ``_inline``).
                self._norms[label] = _write(folder, named, copy=False, measure=norms, known=known)
                return
        except Exception as exc:
            raise self._failed(exc) from exc
        # Safe to overwrite the staging buffers: the previous snapshot is on disk (``_wait``).
        copies = [(name, None if t is None else self._stage(name, t)) for name, t in named]

        def run() -> None:
            try:
                self._norms[label] = _write(folder, copies, copy=False, measure=norms, known=known)
            except BaseException as exc:  # noqa: BLE001 - kept, raised by the caller's next call
                self._error = exc
            finally:
                copies.clear()

        self._thread = threading.Thread(target=run, name=f"snapshot-{label}", daemon=True)
        self._thread.start()

    def norms(self, label: str) -> dict[str, float | None]:
        self._wait()
        return self._norms[label]

    def settle(self) -> None:
        """Wait for the pending snapshot, keeping its error for ``close``."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def close(self) -> None:
        """Wait for the pending snapshot; its error, if any, is raised here. Frees the staging
        buffers."""
        try:
            self._wait()
        finally:
            self._staging.clear()


def has_snapshot(directory: Path, label: str) -> bool:
    return (directory / label / INDEX).exists()


class _Pages:
    """The private memory map behind one reference tensor read from a raw snapshot file."""

    def __init__(self, mapping: mmap.mmap, itemsize: int) -> None:
        self.mapping, self.itemsize = mapping, itemsize

    def release(self, start: int, stop: int) -> None:
        """Drop the mapped pages wholly inside elements [start, stop) from this process's RSS.
        Never written, they are the file's own pages: touched again, they are read back from
        the page cache (``/dev/shm``, or the disk's), so no value changes."""
        page = mmap.PAGESIZE
        lo = -(-start * self.itemsize // page) * page
        hi = stop * self.itemsize // page * page
        if hi > lo and hasattr(self.mapping, "madvise"):
            self.mapping.madvise(mmap.MADV_DONTNEED, lo, hi - lo)


def _mapped(folder: Path, file: str, dtype: str | None, shape: list[int]) -> tuple[Any, _Pages | None]:
    """One snapshot tensor on the CPU, and the map behind it (None: not a raw mapped file)."""
    import numpy as np
    import torch

    if dtype is None:
        return torch.load(folder / file, map_location="cpu", mmap=True, weights_only=True), None
    kind = getattr(torch, dtype)
    if not (folder / file).stat().st_size:
        return torch.empty(shape, dtype=kind), None
    # mmap, copy-on-write (never written): the file's pages are read as the comparison touches
    # them, not copied first; the map stays open while the tensor lives.
    with open(folder / file, "rb") as fh:
        mapping = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
    raw = np.frombuffer(mapping, dtype=np.uint8)
    tensor = torch.from_numpy(raw).view(kind).reshape(shape)
    return tensor, _Pages(mapping, tensor.element_size())


def _read_paged(directory: Path, label: str, device: Any) -> Iterator[tuple[str, Any, _Pages | None]]:
    """``read_snapshot``, with each tensor's map where the tensor read is the mapped one."""
    folder = directory / label
    if not (folder / INDEX).exists():
        return
    for name, file, dtype, shape in json.loads((folder / INDEX).read_text()):
        if file is None:
            yield name, None, None
            continue
        tensor, pages = _mapped(folder, file, dtype, shape)
        moved = tensor.to(device)
        # On a device the copy there is what is compared: the host map is dropped with it.
        yield name, moved, pages if pages is not None and moved.data_ptr() == tensor.data_ptr() else None


def read_snapshot(directory: Path, label: str, device: Any) -> Iterator[tuple[str, Any]]:
    """(name, tensor on ``device`` or None) one at a time, in the order written. A missing
    snapshot yields nothing (the reference never reached that point)."""
    for name, tensor, _ in _read_paged(directory, label, device):
        yield name, tensor


def compare_snapshot(named: list[tuple[str, Any]], snapshots: Path, label: str, device: Any,
                     *, grad: bool) -> list[Compared]:
    """This rank's live tensors against the reference's snapshot ``label``, one at a time.

    Every name of either side is compared (reference order first): a name missing on one side
    is reported as such, and a name without a gradient on both sides is "no gradient on either
    side". The reference's tensor is dropped before the next one is read, and a memory-mapped
    one's pages as soon as each chunk of it is compared: the rank's RSS holds a chunk of the
    reference, not its largest tensor (docs/memory.md).
    """
    mine = dict(named)
    out: list[Compared] = []
    for name, ref, pages in _read_paged(snapshots, label, device):
        out.append(compare_tensor(name, mine.pop(name, None), ref, grad=grad,
                                  release=None if pages is None else pages.release))
        del ref, pages
    out += [compare_tensor(name, got, None, grad=grad) for name, got in mine.items()]
    return out
