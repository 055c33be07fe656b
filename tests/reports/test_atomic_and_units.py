"""The helpers every report file goes through: the atomic write and the byte-size text."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from ddp_conformance.reports import atomic
from ddp_conformance.reports.atomic import atomic_write_text
from ddp_conformance.reports.units import fmt_bytes


def test_atomic_write_replaces_the_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "report.md"
    path.write_text("old")
    atomic_write_text(path, "new ✅")
    assert path.read_text(encoding="utf-8") == "new ✅"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.md"]


def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "run.json"
    path.write_text("{}")

    def full_disk(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic.os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left on device"):
        atomic_write_text(path, '{"finished": 1}')
    assert path.read_text() == "{}"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json"]


@pytest.mark.parametrize(("n", "text"), [
    (0, "0 B"), (512, "512 B"), (1023, "1023 B"), (1024, "1 KiB"), (4096, "4 KiB"), (1536, "1.5 KiB"),
    (1 << 20, "1 MiB"), (16 << 20, "16 MiB"), (25 * (1 << 20), "25 MiB"), (1 << 30, "1 GiB"), (3 << 30, "3 GiB"),
    (1078888, "1.03 MiB"), (5656, "5.52 KiB"), (250 * 1024 + 300, "250 KiB"),
])
def test_fmt_bytes_uses_binary_units_with_their_iec_names(n: int, text: str) -> None:
    assert fmt_bytes(n) == text


def test_the_perf_check_and_the_charts_write_sizes_with_the_same_function() -> None:
    from conformance.perf import allreduce_bandwidth
    from conformance.perf.maths import bandwidth as bandwidth_math
    from ddp_conformance.reports import charts

    assert allreduce_bandwidth.fmt_bytes is fmt_bytes
    assert bandwidth_math.fmt_bytes is fmt_bytes
    assert charts.fmt_bytes is fmt_bytes
    point = bandwidth_math.SweepPoint(nbytes=1 << 20, time_s=1e-3, world_size=2, iterations=1, wrong=0)
    assert bandwidth_math.key_figure([point]).endswith("@1 MiB")
