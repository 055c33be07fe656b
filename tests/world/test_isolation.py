"""A world is loopback only, speaks a strict protocol, and goes away fast.

- every listening socket of a running world (supervisor's store, ranks' gloo pairs) is on
  127.0.0.1 or ::1, read from /proc/net/tcp{,6};
- a garbled message or a reply to another call replaces the world (no stale answer serves
  the next check);
- close() with every rank busy takes one shared grace period, not one per rank;
- the culprit named first is the rank that died, not the peer that saw it vanish.
"""

from __future__ import annotations

import os
import time

import pytest

from conformance.harness.timing import CLOSE_GRACE_S
from conformance.harness.world import RankFailure, World, WorldLike
from conformance.harness.world._protocol import encode
from conformance.harness.world.attach import AttachedWorld, RankZeroLocalWorld
from conformance.harness.world import process_running

from ..conftest import Pace
from . import _work

#: The deadline of these worlds on a quiet host, scaled by the host's measured contention
#: (``pace``) where a world is built: under load a healthy call takes longer (issue 24).
DEADLINE = 6.0
_LISTEN = "0A"
_LOOPBACK = {"0100007F", "00000000000000000000000001000000", "0000000000000000FFFF00000100007F"}


def _socket_inodes(pid: int) -> set[int]:
    out = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            out.add(int(link[8:-1]))
    return out


def _listening(inodes: set[int]) -> list[tuple[str, str]]:
    """(table, local address hex) of every LISTEN socket among ``inodes``."""
    found = []
    for table in ("tcp", "tcp6"):
        with open(f"/proc/net/{table}") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if fields[3] == _LISTEN and int(fields[9]) in inodes:
                    found.append((table, fields[1]))
    return found


def test_every_listening_socket_of_a_running_world_is_on_loopback(pace: Pace) -> None:
    with World(2, "gloo", deadline=pace.bound(DEADLINE)) as world:
        world.run(_work.allreduce_sum, 1.0)  # gloo's pairs are connected by now
        inodes = _socket_inodes(os.getpid())
        for result in world.run(_work.listening_inodes):
            inodes |= set(result.value)
        listening = _listening(inodes)
        assert listening, "the world's store must be listening somewhere"
        exposed = [(t, a) for t, a in listening if a.split(":")[0] not in _LOOPBACK]
        assert not exposed, f"sockets listening beyond loopback: {exposed}"


def test_the_loopback_check_sees_a_wildcard_socket() -> None:
    """The test above can fail: a socket bound to 0.0.0.0 is reported as exposed."""
    import socket

    sock = socket.socket()
    sock.bind(("0.0.0.0", 0))
    sock.listen(1)
    try:
        listening = _listening(_socket_inodes(os.getpid()))
        assert any(a.split(":")[0] not in _LOOPBACK for _, a in listening)
    finally:
        sock.close()


@pytest.mark.parametrize("work, why", [(_work.garble_then_return, "sent a malformed message"),
                                       (_work.stale_reply_then_return, "answered call 10000")])
def test_a_malformed_or_stale_reply_replaces_the_world(work, why, pace: Pace) -> None:
    with World(2, "gloo", deadline=pace.bound(DEADLINE)) as world:
        before = world.generation
        with pytest.raises(RankFailure, match=f"rank 1 {why}"):
            world.run(work, 1)
        assert not world.alive  # killed at once: it never serves another call
        assert [r.value for r in world.run(_work.rank_and_pid)][0][0] == 0
        assert world.generation == before + 1


@pytest.mark.timing
def test_close_with_every_rank_busy_takes_one_grace_period(pace: Pace) -> None:
    world = World(4, "gloo", deadline=pace.bound(DEADLINE)).start()
    pids = world.pids
    try:
        for conn in world._conns:  # every rank busy in Python: none will read the stop message
            conn.send_bytes(encode("call", 99, (_work.busy_forever, (), {})))
        started = time.monotonic()
        world.close()
        took = time.monotonic() - started
    finally:
        world._kill()
    # One grace period for all four (it was 5 s per busy rank: 20 s), and a second for the kill
    # and the reaping, both slower on a loaded host.
    bound = pace.bound(CLOSE_GRACE_S + 1.0)
    assert took <= bound, f"close took {took:.2f} s, bound {bound:.2f} s"
    assert not any(process_running(p) for p in pids)


@pytest.mark.parametrize("how, death", [("exit", "exit code 3"), ("segfault", "killed by SIGSEGV")])
def test_the_rank_that_died_is_named_first(how: str, death: str, pace: Pace) -> None:
    with World(2, "gloo", deadline=pace.bound(DEADLINE)) as world:
        with pytest.raises(RankFailure) as info:
            world.run(_work.exit_while_peer_in_collective, how)
    assert str(info.value).startswith(f"rank 1 died ({death})"), str(info.value)
    assert info.value.culprit is not None and info.value.culprit.rank == 1


def test_every_world_kind_is_world_like() -> None:
    world = World(1, "gloo")
    assert isinstance(world, WorldLike)
    for cls in (AttachedWorld, RankZeroLocalWorld):
        for name in ("run", "close", "start", "hostnames"):
            assert hasattr(cls, name), f"{cls.__name__} lacks {name}"


@pytest.mark.parametrize("env, pinned", [
    ({"MASTER_ADDR": "127.0.0.1"}, True),
    ({"MASTER_ADDR": "localhost"}, True),
    ({"MASTER_ADDR": "127.0.0.1", "GLOO_SOCKET_IFNAME": "eth7"}, False),
    ({"MASTER_ADDR": "203.0.113.9"}, False),
])
def test_attach_mode_pins_gloo_to_loopback_only_for_a_local_rendezvous(monkeypatch, env, pinned) -> None:
    from conformance.harness.world import loopback_interface
    from conformance.harness.world.attach import pin_loopback_if_local

    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    said = pin_loopback_if_local()
    if pinned:
        assert os.environ["GLOO_SOCKET_IFNAME"] == loopback_interface()
        assert "is loopback" in said
    else:
        assert os.environ.get("GLOO_SOCKET_IFNAME") == env.get("GLOO_SOCKET_IFNAME")
        assert "GLOO_SOCKET_IFNAME" in said
