"""The ``slow-link`` fault owns its effect: at a "link" site it shapes the world's private
network (records the injection with its rate), unshapes it outside its window, and acts at no
other kind of site. With a real private network the qdisc it set is the one ``tc`` shows
inside the namespace -- and nowhere on the host."""

from __future__ import annotations

import subprocess
from typing import Any

import pytest

from conformance.harness.world import LinkShape, PrivateNetwork, unavailable_reason
from ddp_conformance.faults import PHASES, SITE_KINDS, InjectionLog, Site, SlowLink


class _FakeLink:
    def __init__(self) -> None:
        self.calls: list[LinkShape | None] = []
        self.shape_now: LinkShape | None = None

    def shape(self, shape: LinkShape | None) -> None:
        self.calls.append(shape)
        self.shape_now = shape


def test_slow_link_shapes_only_at_a_link_site_in_its_window_and_records_it() -> None:
    fault, link, log = SlowLink(rate_gbps=0.2, steps=(1, 2)), _FakeLink(), InjectionLog()
    others = [Site(kind, 0, 1, phase, log, link=link) for kind in SITE_KINDS if kind != "link" for phase in PHASES]
    assert not any(fault.inject(site) for site in others)
    fired = [fault.inject(Site("link", 0, step, "data", log, link=link)) for step in range(4)]
    assert fired == [False, True, True, False]
    # step 0: never shaped, nothing to undo; steps 1, 2: shaped; step 3: the window is over.
    assert [None if c is None else c.rate_bits_per_s for c in link.calls] == [2e8, 2e8, None]
    assert [(i.name, i.step, i.data["rate_gbps"]) for i in log.items] == [("slow-link", 1, 0.2),
                                                                        ("slow-link", 2, 0.2)]
    assert not fault.inject(Site("link", 0, 1, "data", log))  # a world without a private network


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"rate_gbps": 0.00001}, r"must be at least 100 kbit/s"),
    ({"rate_gbps": 1.0, "burst_bytes": 100}, r"must hold one packet"),
    ({"rate_gbps": 1.0, "latency_s": 0}, r"latency_s=0 must be in \(0, 10\]"),
])
def test_a_bad_slow_link_is_refused_with_the_rule(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SlowLink(**kwargs)


def test_slow_link_on_a_real_private_network_sets_tbf_inside_the_namespace_only() -> None:
    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    host_before = subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True).stdout
    net = PrivateNetwork().start()
    try:
        log = InjectionLog()
        assert SlowLink(rate_gbps=0.2).inject(Site("link", 0, 0, "data", log, link=net))
        inside = subprocess.run(["nsenter", f"--net={net.path}", "tc", "qdisc", "show", "dev", "lo"],
                                capture_output=True, text=True, timeout=10).stdout
        assert "tbf" in inside and "rate 200Mbit" in inside, inside
        assert subprocess.run(["tc", "qdisc", "show"], capture_output=True, text=True).stdout == host_before
        net.shape(None)
        inside = subprocess.run(["nsenter", f"--net={net.path}", "tc", "qdisc", "show", "dev", "lo"],
                                capture_output=True, text=True, timeout=10).stdout
        assert "tbf" not in inside, inside
        assert " mtu 65536 " in _link(net)  # loopback's own again
        # The scaling-cliff sweep's unshaped point: the same link (its MTU) without the rate limit.
        net.shape(None, unshaped_mtu=1500)
        assert " mtu 1500 " in _link(net)
        with pytest.raises(ValueError, match="unshaped_mtu"):
            net.shape(None, unshaped_mtu=100)
    finally:
        net.close()


def test_a_tc_that_refuses_is_a_network_unavailable_naming_the_command() -> None:
    from conformance.harness.world import NetworkUnavailable

    reason = unavailable_reason()
    if reason:
        pytest.skip(reason)
    net = PrivateNetwork(tc="/bin/false").start()
    try:
        with pytest.raises(NetworkUnavailable, match=r"private network shape failed: `/bin/false qdisc replace "
                                                     r"dev lo root tbf rate 100000000bit .*` exited 1"):
            SlowLink(rate_gbps=0.1).inject(Site("link", 0, 0, "data", InjectionLog(), link=net))
    finally:
        net.close()


def _link(net: PrivateNetwork) -> str:
    return subprocess.run(["nsenter", f"--net={net.path}", "ip", "link", "show", "lo"],
                          capture_output=True, text=True, timeout=10).stdout
