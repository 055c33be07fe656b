"""The reference's snapshot files: every dtype and layout round-trips bit for bit, the index
appears last, the background writer holds one pending copy and never loses a write error.

- raw files round-trip float32/bfloat16/float16/int64/bool tensors, 0-d and empty ones and a
  sparse gradient (torch.save fallback) exactly; a view writes only its own bytes;
- ``SnapshotWriter`` copies at ``write`` (the caller may change its tensors at once), writes
  ``index.json`` after every tensor file, waits for the pending write before the next copy,
  and raises a failed write on the next call, naming the folder and the fix.
"""

from __future__ import annotations

import json
import threading

import pytest
import torch

from conformance.checks.equivalence import snapshots as _snapshots
from conformance.checks.equivalence.snapshots import (
    INDEX,
    SnapshotWriter,
    read_snapshot,
    write_snapshot,
)

CPU = torch.device("cpu")


def _tensors() -> list[tuple[str, torch.Tensor | None]]:
    g = torch.Generator().manual_seed(0)
    return [
        ("f32", torch.randn(7, 5, generator=g)),
        ("bf16", torch.randn(33, generator=g).to(torch.bfloat16)),
        ("f16", torch.randn(2, 3, 4, generator=g).half()),
        ("i64", torch.arange(-5, 6)),
        ("bool", torch.tensor([True, False, True])),
        ("scalar", torch.tensor(3.25)),
        ("empty", torch.empty(0, 4)),
        ("strided", torch.randn(6, 8, generator=g).t()),
        ("sparse", torch.sparse_coo_tensor([[0, 2]], [1.5, -2.0], (4,))),
        ("none", None),
    ]


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is b
    if a.is_sparse:
        a, b = a.to_dense(), b.to_dense()
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def test_every_dtype_and_layout_round_trips_exactly(tmp_path):
    named = _tensors()
    norms = write_snapshot(tmp_path, "s", named)
    read = list(read_snapshot(tmp_path, "s", CPU))
    assert [n for n, _ in read] == [n for n, _ in named]
    bad = [n for (n, a), (_, b) in zip(named, read) if not _same(a, b)]
    assert bad == []
    assert norms["f32"] == pytest.approx(float(named[0][1].double().norm()))  # type: ignore[union-attr]
    assert norms["i64"] is None and norms["none"] is None
    assert norms["sparse"] == pytest.approx(float(torch.tensor([1.5, -2.0]).double().norm()))


def test_a_mismatch_is_not_hidden_by_the_format(tmp_path):
    # The reader returns what was written, not something close: a changed element shows.
    t = torch.randn(100)
    write_snapshot(tmp_path, "s", [("w", t)])
    changed = t.clone()
    changed[17] += 1e-6
    (_, got), = read_snapshot(tmp_path, "s", CPU)
    assert torch.equal(got, t) and not torch.equal(got, changed)


def test_the_writer_copies_at_write_and_publishes_the_index_last(tmp_path, monkeypatch):
    order: list[str] = []
    real = _snapshots._save

    def spy(folder, i, tensor):  # type: ignore[no-untyped-def]
        order.append(f"{i}:{(folder / INDEX).exists()}")
        return real(folder, i, tensor)

    monkeypatch.setattr(_snapshots, "_save", spy)
    live = torch.ones(1000)
    writer = SnapshotWriter(tmp_path)
    writer.write("p0", [("w", live), ("b", None)])
    live.add_(1.0)  # the next step moves the live tensor at once: the snapshot must not see it
    assert writer.norms("p0")["w"] == pytest.approx(1000 ** 0.5)
    writer.write("p0", [("w", live)])  # written again: the old index is gone before new files land
    writer.close()
    assert order == ["0:False", "0:False"]
    (_, got), = read_snapshot(tmp_path, "p0", CPU)
    assert torch.equal(got, torch.full((1000,), 2.0))
    assert json.loads((tmp_path / "p0" / INDEX).read_text())[0][:2] == ["w", "0.bin"]


def test_the_writer_holds_one_pending_snapshot(tmp_path, monkeypatch):
    release = threading.Event()
    real = _snapshots._write
    started: list[str] = []

    def slow(folder, named, **kwargs):  # type: ignore[no-untyped-def]
        started.append(folder.name)
        assert release.wait(30)
        return real(folder, named, **kwargs)

    monkeypatch.setattr(_snapshots, "_write", slow)
    writer = SnapshotWriter(tmp_path)
    writer.write("a", [("w", torch.ones(3))])
    blocked = threading.Thread(target=writer.write, args=("b", [("w", torch.zeros(3))]))
    blocked.start()
    blocked.join(0.3)
    # The second write waits for the first: no second copy exists while one is pending.
    assert blocked.is_alive() and started == ["a"]
    release.set()
    blocked.join(30)
    writer.close()
    assert started == ["a", "b"] and (tmp_path / "b" / INDEX).exists()


def test_a_write_error_is_raised_by_the_next_call(tmp_path):
    blocker = tmp_path / "x"
    blocker.write_text("a file where the snapshot's folder should go")
    writer = SnapshotWriter(blocker)
    writer.write("p0", [("w", torch.ones(3))])
    with pytest.raises(RuntimeError, match=r"writing the reference's snapshot to .*x failed: .*the "
                                           r"check's temp dir must be writable"):
        writer.close()
    writer.close()  # reported once; the writer is usable again
    writer.write("p1", [("w", torch.ones(3))])
    with pytest.raises(RuntimeError, match="failed"):
        writer.write("p2", [("w", torch.ones(3))])


def test_snapshots_go_to_memory_while_they_fit_and_readers_see_one_layout(tmp_path, monkeypatch):
    disk, memory = tmp_path / "disk", tmp_path / "memory"
    disk.mkdir()
    memory.mkdir()
    w = torch.randn(1000)  # 4000 bytes
    monkeypatch.setattr(_snapshots, "memory_room", lambda folder: 4 * 4000)  # fits: a quarter
    writer = SnapshotWriter(disk, memory=memory)
    writer.write("initial", [("w", w)], norms=False)
    monkeypatch.setattr(_snapshots, "memory_room", lambda folder: 4 * 4000 - 1)  # no longer fits
    writer.write("params0", [("w", w + 1)], norms=False)
    writer.close()
    assert (disk / "initial").is_symlink() and (memory / "initial" / INDEX).exists()
    assert not (disk / "params0").is_symlink() and (disk / "params0" / INDEX).exists()
    assert not (memory / "params0").exists()
    (_, a), = read_snapshot(disk, "initial", CPU)
    (_, b), = read_snapshot(disk, "params0", CPU)
    assert torch.equal(a, w) and torch.equal(b, w + 1)
    assert writer.norms("initial") == {"w": None}, "norms only where asked for"
    # Written again, a label stays where it first went (the readers' path never changes).
    write_snapshot(disk, "params0", [("w", w)], memory=memory)
    assert not (disk / "params0").is_symlink()


def test_memory_room_is_the_least_of_free_space_available_memory_and_the_cgroup(tmp_path, monkeypatch):
    free = _snapshots.memory_room(tmp_path)
    assert free > 0
    monkeypatch.setattr(_snapshots, "available_memory", lambda: 12345)
    assert _snapshots.memory_room(tmp_path) == 12345
    monkeypatch.setattr(_snapshots, "_cgroup_room", lambda: 678)
    assert _snapshots.memory_room(tmp_path) == 678
    assert _snapshots.memory_room(tmp_path / "absent") == 0


def test_the_writer_stages_every_snapshot_in_one_reused_copy(tmp_path):
    writer = SnapshotWriter(tmp_path)
    live = torch.zeros(1000)
    writer.write("p0", [("w", live)])
    writer.settle()
    staged = writer._staging["w"].data_ptr()
    live.add_(1.0)
    writer.write("p1", [("w", live)])
    writer.settle()
    # The second snapshot reused the first one's buffer (the previous write had landed)...
    assert writer._staging["w"].data_ptr() == staged and staged != live.data_ptr()
    writer.close()
    # ...and each file holds what the tensor was at its own write.
    assert torch.equal(next(read_snapshot(tmp_path, "p0", CPU))[1], torch.zeros(1000))
    assert torch.equal(next(read_snapshot(tmp_path, "p1", CPU))[1], torch.ones(1000))
    assert writer._staging == {}, "close frees the staging copy"


def test_a_snapshot_into_memory_on_a_busy_host_is_written_at_once_from_the_live_tensors(tmp_path, monkeypatch):
    disk, memory = tmp_path / "disk", tmp_path / "memory"
    disk.mkdir()
    memory.mkdir()
    monkeypatch.setattr(_snapshots, "_inline", lambda named: True)  # every core trains
    writer = SnapshotWriter(disk, memory=memory)
    live = torch.ones(100)
    writer.write("grads0", [("w", live)])
    # Written before write() returned (no thread, no staging copy): the next step may move it.
    assert (disk / "grads0" / INDEX).exists() and writer._thread is None and writer._staging == {}
    live.add_(1.0)
    assert torch.equal(next(read_snapshot(disk, "grads0", CPU))[1], torch.ones(100))
    assert writer.norms("grads0")["w"] == pytest.approx(10.0)
    # A failure is raised by that very call, with the folder and the fix.
    (memory / "params0").write_text("a file where the snapshot's folder should go")
    with pytest.raises(RuntimeError, match=r"writing the reference's snapshot to .* failed: .*must be writable"):
        writer.write("params0", [("w", live)])
    writer.close()


def _own_peak_kib() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("VmHWM:"))


def test_comparing_a_snapshot_holds_a_chunk_of_the_reference_in_the_rank_not_its_whole_tensor(tmp_path):
    # A rank compares its live tensor against the reference's memory-mapped file: the mapped
    # pages count in its RSS, so a whole 64 MiB reference tensor stood on top of the rank's
    # peak (the largest tensor of the model, ~0.1 of the training step at 100 M parameters).
    from conformance.checks.equivalence.snapshots import compare_snapshot
    from conformance.harness.resources import reset_peak

    live = torch.randn(16 << 20, generator=torch.Generator().manual_seed(0))  # 64 MiB
    write_snapshot(tmp_path, "grads0", [("w", live)])
    if not reset_peak():
        pytest.skip("the process's peak RSS cannot be reset here (/proc/self/clear_refs)")
    before = _own_peak_kib()
    (compared,) = compare_snapshot([("w", live)], tmp_path, "grads0", CPU, grad=True)
    grown_mib = (_own_peak_kib() - before) / 1024
    # Pages dropped after the first pass read back the file's values in the second: got == ref.
    assert compared.diff.max_abs == 0.0 and compared.ref_sq > 0 and compared.residual == 0.0
    assert compared.diff.worst_element is not None
    _, got_value, ref_value = compared.diff.worst_element
    assert got_value == ref_value
    assert grown_mib < 24, f"the peak grew by {grown_mib:.0f} MiB comparing a 64 MiB tensor"
