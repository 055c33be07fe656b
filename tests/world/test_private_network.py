"""A World in a private network namespace (``private_network=True``, the ``slow-link`` fault's
ground): the ranks see only their own loopback, the shaping is theirs alone, and nothing --
no rank, no holder process, no namespace, no temp file -- outlives the world, even when its
supervisor is SIGKILLed. Without the privilege or ``tc`` it is refused with the reason."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conformance.harness.world import LinkShape, NetworkUnavailable, World, unavailable_reason
from conformance.harness.world import process_running

from ..conftest import Pace
from . import _work

ROOT = Path(__file__).resolve().parents[2]
REASON = unavailable_reason()
needs_privilege = pytest.mark.skipif(REASON is not None, reason=f"no private network here: {REASON}")


def _in_namespace(netns: str) -> list[int]:
    """Live processes whose network namespace is ``netns`` (``net:[inode]``)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.readlink(f"/proc/{entry}/ns/net") == netns and process_running(int(entry)):
                    found.append(int(entry))
            except OSError:
                continue
    return found


def _gone(pids: list[int], netns: str, pace: Pace, seconds: float = 5.0) -> None:
    until = time.monotonic() + pace.bound(seconds)
    while (any(process_running(p) for p in pids) or _in_namespace(netns)) and time.monotonic() < until:
        time.sleep(0.05)
    assert not [p for p in pids if process_running(p)], "processes outlived the world"
    assert not _in_namespace(netns), "the private network namespace outlived the world"


@pytest.mark.timing
@needs_privilege
def test_ranks_share_a_private_shaped_loopback_and_leave_nothing_behind(pace: Pace) -> None:
    host = os.readlink("/proc/self/ns/net")
    host_qdisc = subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True).stdout
    world = World(2, "gloo", deadline=60, private_network=True)
    try:
        assert [r.value for r in world.run(_work.allreduce_sum, 1.0)] == [3.0, 3.0]
        assert world.link is not None
        world.link.shape(LinkShape(rate_bits_per_s=200e6))
        views = [r.value for r in world.run(_work.network_view)]
        assert [r.value for r in world.run(_work.allreduce_sum, 1.0)] == [3.0, 3.0]  # through the shaped link
        pids, holder, tmpdir = world.pids, world.link.pid, world.tmpdir
    finally:
        world.close()
    netns = views[0]["netns"]
    assert netns != host and views[1]["netns"] == netns
    assert views[0]["interfaces"] == ["lo"]  # no path to the host's network exists in there
    assert "tbf" in views[0]["qdisc"] and "rate 200Mbit" in views[0]["qdisc"]
    assert subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True).stdout == host_qdisc
    assert holder is not None and tmpdir is not None
    _gone([*pids, holder], netns, pace)
    assert not tmpdir.exists()


@pytest.mark.timing
@needs_privilege
def test_sigkill_of_the_supervisor_leaves_no_rank_holder_namespace_or_temp_dir(tmp_path: Path, pace: Pace) -> None:
    script = tmp_path / "supervisor.py"
    script.write_text(
        "import os, sys, time\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "from conformance.harness.world import LinkShape, World\n"
        "from tests.world import _work\n"
        "if __name__ == '__main__':\n"
        "    w = World(2, 'gloo', deadline=60, private_network=True)\n"
        "    w.run(_work.allreduce_sum, 1.0)\n"
        "    w.link.shape(LinkShape(rate_bits_per_s=50e6))\n"
        "    netns = w.run(_work.network_view)[0].value['netns']\n"
        "    print(*w.pids, w.link.pid, netns, w.tmpdir, flush=True)\n"
        "    time.sleep(600)\n")
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=ROOT,
                            start_new_session=True)
    try:
        *pids, netns, tmpdir = proc.stdout.readline().split()  # type: ignore[union-attr]
        assert netns.startswith("net:") and _in_namespace(netns)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        _gone([int(p) for p in pids], netns, pace)
        until = time.monotonic() + pace.bound(5)
        while os.path.exists(tmpdir) and time.monotonic() < until:
            time.sleep(0.05)
        assert not os.path.exists(tmpdir), "the world's temp dir outlived its supervisor"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


def test_without_the_capabilities_or_tc_the_reason_is_named() -> None:
    assert "needs CAP_SYS_ADMIN and CAP_NET_ADMIN" in (unavailable_reason(caps=0) or "")
    assert "CAP_NET_ADMIN" in (unavailable_reason(caps=1 << 21) or "")
    assert "`no-such-tc` (iproute2) is not installed" in (unavailable_reason(tc="no-such-tc", caps=-1) or "")


UNPRIVILEGED = """
import sys
sys.path.insert(0, {root!r})
from conformance.harness.world import NetworkUnavailable, World, unavailable_reason
print("reason:", unavailable_reason())
world = World(2, "gloo", deadline=30, private_network=True)
try:
    world.start()
except NetworkUnavailable as exc:
    print("refused:", exc)
world.close()
"""


def test_an_unprivileged_process_is_refused_with_the_reason_and_leaves_nothing(tmp_path: Path) -> None:
    """A real unprivileged run: a user namespace without a root mapping has no capability."""
    if subprocess.run(["unshare", "--user", "true"], capture_output=True).returncode != 0:
        pytest.skip("cannot create a user namespace here to run unprivileged")
    tmp = tmp_path / "tmp"
    tmp.mkdir(mode=0o777)
    tmp.chmod(0o777)
    done = subprocess.run(["unshare", "--user", sys.executable, "-c", UNPRIVILEGED.format(root=str(ROOT))],
                          capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, "TMPDIR": str(tmp)})
    assert done.returncode == 0, done.stderr
    assert "reason: a private network namespace needs CAP_SYS_ADMIN and CAP_NET_ADMIN" in done.stdout
    assert "refused: a private network namespace needs" in done.stdout
    assert list(tmp.iterdir()) == []


def test_a_world_whose_network_cannot_start_raises_and_cleans_up(monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    from conformance.harness.world import _netns

    monkeypatch.setattr(_netns, "unavailable_reason", lambda **_: "simulated: no CAP_NET_ADMIN")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    world = World(2, "gloo", deadline=30, private_network=True)
    with pytest.raises(NetworkUnavailable, match="simulated: no CAP_NET_ADMIN"):
        world.start()
    assert world.pids == [] and world.link is None
    assert list(tmp_path.iterdir()) == []
    world.close()
