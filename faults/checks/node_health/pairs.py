"""Ring pairs on addresses of their own in a world's private network, so that one pair can be slowed.

In a world started with ``private_network=True`` (``conformance/harness/world/_netns.py``) every
rank runs in one network namespace whose loopback carries all of gloo's bytes; shaping that
loopback slows every pair at once (the ``slow-link`` fault). A slow *pair* needs to tell the
pairs apart, so here:

- :func:`new_pair_groups`: for each pair it belongs to, each rank gives itself an address in
  that pair's own subnet, ``10.39.<pair>.<rank + 1>``, on an interface of its own (a veth end:
  the only kind of link this kernel offers without a module that is often missing) inside the
  namespace, and makes the pair's group with ``GLOO_SOCKET_IFNAME`` set to it (gloo reads it
  when a group is made). Between two local addresses the kernel picks the destination as the
  source: a pair's connections run from and to its listener's address, so what tells the pairs
  apart is the subnet, not the two ends' addresses;
- :class:`PairShaper`: the "link" a :class:`~faults.injectors.SlowPair` shapes: an ``htb``
  qdisc on the namespace's ``lo``, one class at the pair's rate that a ``u32`` filter sends the
  pair's subnet to, everything else unlimited.

Nothing here touches the host's network: every command runs inside the namespace the rank
joined, and the namespace dies with the world. Without the privilege the world does not start
(``NetworkUnavailable``, its reason): tests skip with it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conformance.harness.world import LinkShape, RankContext

#: The private network's addresses for the ranks' pair links: SUBNET.<pair index>.<rank + 1>.
SUBNET = "10.39"
#: How long one ``ip``/``tc`` command may take (milliseconds when idle; seconds under load).
COMMAND_S = 20.0
_SBIN = "/usr/sbin:/sbin:/usr/local/sbin"
#: The unlimited class's rate: far above any loopback's (a rate is required by htb).
_UNLIMITED = "100gbit"


def address(index: int, rank: int) -> str:
    """``rank``'s address in the subnet of the ``index``-th pair."""
    return f"{SUBNET}.{index}.{rank + 1}"


def _run(*argv: str) -> None:
    tool = shutil.which(argv[0], path=f"{os.environ.get('PATH', '')}:{_SBIN}")
    if tool is None:
        raise RuntimeError(f"`{argv[0]}` (iproute2) is not installed: pairs cannot be told apart; install iproute2")
    done = subprocess.run([tool, *argv[1:]], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=COMMAND_S)
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise RuntimeError(f"`{' '.join(argv)}` exited {done.returncode}: {said[-1] if said else 'no message'}")


def _interface(index: int, rank: int) -> str:
    """An interface holding ``rank``'s address in pair ``index``'s subnet (made here)."""
    name, peer = f"nh{index}r{rank}", f"nh{index}r{rank}p"
    _run("ip", "link", "add", name, "type", "veth", "peer", "name", peer)
    _run("ip", "addr", "add", f"{address(index, rank)}/32", "dev", name)
    # Both ends up: an address on a link without carrier is not a local address to bind.
    _run("ip", "link", "set", name, "up")
    _run("ip", "link", "set", peer, "up")
    return name


def new_pair_groups(ctx: RankContext, pairs: list[tuple[int, int]]) -> list[Any]:
    """A 2-rank group per pair, each of its ranks on an address in the pair's subnet (module
    docstring). Collective: every rank calls it with the same pairs."""
    import torch.distributed as dist

    before = os.environ.get("GLOO_SOCKET_IFNAME")
    groups = []
    try:
        for index, pair in enumerate(pairs):
            if ctx.rank in pair:
                # gloo picks a new group's interface from this variable when the group is made:
                # set for this pair's group only, and put back after (the world's own groups
                # stay on the loopback's 127.0.0.1).
                os.environ["GLOO_SOCKET_IFNAME"] = _interface(index, ctx.rank)
            # new_group is itself collective: every rank makes every pair's group, in one order.
            groups.append(dist.new_group(list(pair)))
    finally:
        if before is None:
            os.environ.pop("GLOO_SOCKET_IFNAME", None)
        else:
            os.environ["GLOO_SOCKET_IFNAME"] = before
    return groups


class PairShaper:
    """The private network's loopback, chosen pairs shaped (module docstring). ``pairs``: the
    ring pairs, in the order their groups were made (:func:`new_pair_groups`)."""

    def __init__(self, pairs: list[tuple[int, int]]) -> None:
        self.pairs = list(pairs)
        self.shaped: dict[tuple[int, int], LinkShape] = {}

    def shape_pair(self, pair: tuple[int, int], shape: LinkShape | None) -> None:
        """``pair``'s packets limited to ``shape``'s rate (None: unlimited again)."""
        key = (int(pair[0]), int(pair[1]))
        if key not in self.pairs:
            raise ValueError(f"pair={pair!r} is not a ring pair of this world ({self.pairs})")
        if shape is None:
            self.shaped.pop(key, None)
        else:
            self.shaped[key] = shape
        self._apply()

    def shape(self, shape: LinkShape | None) -> None:
        """The whole link: not here (a :class:`~faults.injectors.SlowLink` shapes the whole
        private network from the supervisor, through ``World.link``)."""
        raise RuntimeError("the node-health pair links shape one pair at a time (SlowPair); SlowLink shapes "
                           "the whole private network from the supervisor (World.link)")

    def _apply(self) -> None:
        self.close()
        if not self.shaped:
            return
        _run("tc", "qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb", "default", "1")
        _run("tc", "class", "add", "dev", "lo", "parent", "1:", "classid", "1:1", "htb", "rate", _UNLIMITED)
        for pair, shape in sorted(self.shaped.items()):
            index = self.pairs.index(pair)
            rate = f"{int(shape.rate_bits_per_s)}bit"
            _run("tc", "class", "add", "dev", "lo", "parent", "1:", "classid", f"1:{index + 10}", "htb",
                 "rate", rate, "ceil", rate, "burst", str(shape.burst))
            _run("tc", "filter", "add", "dev", "lo", "parent", "1:", "protocol", "ip", "prio", "1", "u32",
                 "match", "ip", "dst", f"{SUBNET}.{index}.0/24", "flowid", f"1:{index + 10}")

    def close(self) -> None:
        """The loopback unshaped (nothing to undo: fine)."""
        try:
            _run("tc", "qdisc", "del", "dev", "lo", "root")
        except RuntimeError:
            pass
