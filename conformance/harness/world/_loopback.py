"""The loopback address and interface a local world uses: nothing it opens faces the network."""

from __future__ import annotations

from pathlib import Path

LOOPBACK_HOST = "127.0.0.1"
_IFF_LOOPBACK = 0x8  # linux/if.h


def loopback_interface() -> str:
    """The name of this host's loopback interface (``lo`` on Linux), for GLOO_SOCKET_IFNAME."""
    try:
        for dev in sorted(Path("/sys/class/net").iterdir()):
            try:
                if int((dev / "flags").read_text(), 16) & _IFF_LOOPBACK:
                    return dev.name
            except (OSError, ValueError):
                continue
    except OSError:
        pass
    return "lo"
