"""conformance.harness.resources: what a check cost (time, peak RSS of supervisor and tree) and
the size of its model, measured without holding the model."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from conformance.harness.resources import (
    CostMeter,
    model_size,
    size_metrics,
    tree_rss_bytes,
)
from ddp_conformance.reports.keys import MODEL_BYTES, MODEL_PARAMETERS, PROCESS_PEAK_RSS

MIB = 1 << 20

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _own_rss() -> int:
    """This process's RSS alone (the tree would count a test session's ranks too)."""
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmRSS:"))


def _touch(nbytes: int) -> bytearray:
    buf = bytearray(nbytes)
    buf[::4096] = b"\1" * len(buf[::4096])  # resident, not just reserved
    return buf


def test_a_transient_peak_between_samples_is_seen() -> None:
    """200 MiB allocated and freed while the sampler sleeps: only the kernel's reset peak sees it."""
    with CostMeter(interval_s=30.0) as meter:
        buf = _touch(200 * MIB)
        del buf
    assert meter.cost is not None and meter.cost.supervisor_peak_rss is not None
    baseline = _own_rss()
    assert meter.cost.supervisor_peak_rss >= baseline + 150 * MIB


def test_the_next_check_does_not_inherit_the_previous_peak() -> None:
    with CostMeter(interval_s=30.0):
        buf = _touch(300 * MIB)
        del buf
    with CostMeter(interval_s=30.0) as quiet:
        pass
    assert quiet.cost is not None and quiet.cost.supervisor_peak_rss is not None
    assert quiet.cost.supervisor_peak_rss < _own_rss() + 100 * MIB


def test_the_tree_counts_a_child_process() -> None:
    """A rank-like child holding 200 MiB is in the tree's peak, not in the supervisor's."""
    code = "b = bytearray(200 << 20); b[::4096] = b'\\1' * len(b[::4096]); import time; time.sleep(30)"
    child = subprocess.Popen([sys.executable, "-c", code])
    try:
        with CostMeter(interval_s=0.05) as meter:
            deadline = time.monotonic() + 20
            while (tree_rss_bytes(child.pid) or 0) < 200 * MIB and time.monotonic() < deadline:
                time.sleep(0.1)
            time.sleep(0.2)
            before = tree_rss_bytes() or 0
    finally:
        child.kill()
        child.wait(timeout=10)
    cost = meter.cost
    assert cost is not None and cost.tree_peak_rss is not None and cost.supervisor_peak_rss is not None
    assert (tree_rss_bytes(child.pid) or 0) == 0  # gone: its 200 MiB were seen while it lived
    # The child's 200 MiB are in the tree's peak. (Not `peak >= before`: the worker's own
    # persistent ranks are in the tree too, and a page they touch after the last sample made
    # `before` 4 KiB above the peak once, under three xdist workers.)
    assert before >= cost.supervisor_peak_rss + 200 * MIB
    assert cost.tree_peak_rss >= cost.supervisor_peak_rss + 200 * MIB


def test_progress_lines_follow_the_interval() -> None:
    lines: list[str] = []
    with CostMeter(label="[ddp] x on mlp", progress=lines.append, interval_s=0.02, progress_every_s=0.2):
        time.sleep(0.75)
    assert 2 <= len(lines) <= 4, lines
    assert lines[0].startswith("[ddp] x on mlp: running (") and lines[0].endswith(" s)…")


def test_a_short_check_says_nothing() -> None:
    lines: list[str] = []
    with CostMeter(progress=lines.append, interval_s=0.02, progress_every_s=10.0):
        time.sleep(0.1)
    assert lines == []


class _Target:
    def __init__(self, spec: str, width: int, *, real_storage: bool = False) -> None:
        self.spec, self.width, self.real_storage = spec, width, real_storage

    def build_model(self) -> Any:
        import torch

        model = torch.nn.Sequential(torch.nn.Linear(self.width, self.width), torch.nn.Linear(self.width, 3))
        if self.real_storage:
            model[0].weight.data.numpy()  # a build that needs real memory: refused on meta
        return model


def test_model_size_counts_parameters_and_bytes_without_allocating() -> None:
    width = 20_000  # 400 M parameters, 1.6 GB fp32: only countable on the meta device
    with CostMeter(interval_s=30.0) as meter:
        size = model_size(_Target("huge", width))
    assert size == (width * width + width + 3 * width + 3, 4 * (width * width + width + 3 * width + 3))
    assert meter.cost is not None and (meter.cost.supervisor_peak_rss or 0) < _own_rss() + 200 * MIB
    assert size_metrics(size) == {MODEL_PARAMETERS: size[0], MODEL_BYTES: size[1]}


def test_a_model_that_cannot_be_built_on_meta_has_no_size() -> None:
    assert model_size(_Target("needs-storage", 8, real_storage=True)) is None
    assert size_metrics(None) == {}


# -- through the session: every record carries its cost --------------------------------------

def _allocating_check(ctx: Any) -> Any:
    from conformance.harness.outcome import Outcome

    buf = _touch(150 * MIB)
    del buf
    time.sleep(0.35)
    return Outcome.passed("allocated and freed 150 MiB", metrics={"key_figure": "x"})


def test_run_check_records_cost_and_model_size_with_progress() -> None:
    from conformance.harness import resources
    from conformance.harness.registry import CheckSpec
    from conformance.harness.session import Session, Settings
    from ddp_conformance.reports.keys import SUPERVISOR_PEAK_RSS, TREE_PEAK_RSS

    spec = CheckSpec("cost-probe", "Cost probe", "conformance", "allocates",
                     entry=f"{__name__}:_allocating_check")
    lines: list[str] = []
    session = Session(Settings(), progress=lines.append)
    old = resources.PROGRESS_EVERY_S
    try:
        # The meter's default is read when it is built: a short interval shows the line.
        resources.PROGRESS_EVERY_S = 0.1
        record, _ = session.run_check(spec, "mlp")
    finally:
        resources.PROGRESS_EVERY_S = old
        session.close()
    m = record.metrics
    assert record.status == "passed" and m["key_figure"] == "x"
    assert m[SUPERVISOR_PEAK_RSS] >= 150 * MIB and m[TREE_PEAK_RSS] >= m[SUPERVISOR_PEAK_RSS]
    assert m[MODEL_PARAMETERS] > 0 and m[MODEL_BYTES] == 4 * m[MODEL_PARAMETERS]
    assert lines and lines[0].startswith("[ddp] cost-probe on mlp: running (")


def test_the_model_is_counted_on_a_rank_never_in_the_supervisor(tmp_path: Path) -> None:
    """A build_model that loads a checkpoint (real tensors even under the meta device) must not
    cost the supervisor the model's memory: the size is counted in a rank process."""
    import os

    from conformance.harness.registry import CheckSpec
    from conformance.harness.session import Session, Settings
    from ddp_conformance.reports.keys import MODEL_PARAMETERS

    pids = tmp_path / "build_pids.txt"
    target = tmp_path / "pid_target.py"
    target.write_text(
        "import os\nfrom conformance.targets.mlp import build_model as _mlp, loss_fn, make_batch  # noqa: F401\n"
        f"def build_model():\n    open({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n')\n    return _mlp()\n")
    spec = CheckSpec("cost-probe", "Cost probe", "conformance", "allocates", entry=f"{__name__}:_allocating_check")
    session = Session(Settings())
    try:
        record, _ = session.run_check(spec, str(target))
    finally:
        session.close()
    assert record.metrics[MODEL_PARAMETERS] > 0
    built_in = {int(line) for line in pids.read_text().split()}
    assert built_in and os.getpid() not in built_in


_PHASES = """
import sys
def touch(n):
    b = bytearray(n << 20); b[::4096] = b'\\1' * len(b[::4096]); return b
b = touch(300); del b          # an earlier check's peak
print('ready', flush=True); sys.stdin.readline()
b = touch(150); del b          # this check's transient peak, gone before any sample
print('done', flush=True); sys.stdin.readline()
"""


def test_each_process_peak_is_its_own_exact_and_starts_at_the_check() -> None:
    """A rank-like child's peak during the check: its 150 MiB transient, seen although no sample
    fell inside it (its VmHWM), and not its 300 MiB of before the check (reset at the start)."""
    child = subprocess.Popen([sys.executable, "-c", _PHASES], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "ready"
        with CostMeter(interval_s=30.0) as meter:
            child.stdin.write("go\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "done"
        child.stdin.write("end\n")
        child.stdin.flush()
        child.wait(timeout=20)
    finally:
        child.kill()
        child.wait(timeout=10)
    assert meter.cost is not None
    peak = meter.cost.process_peak_rss[child.pid]
    assert 150 * MIB <= peak < 280 * MIB
    assert meter.cost.metrics()[PROCESS_PEAK_RSS][str(child.pid)] == peak
