"""Worlds: N rank processes with an initialised process group, run by a supervisor."""

from __future__ import annotations

from ._caches import compile_cache_env
from ._containment import guardian, proc_state, process_running
from ._loopback import loopback_interface
from ._netns import ETHERNET_MTU, LinkShape, NetworkUnavailable, PrivateNetwork, unavailable_reason
from ._rank import RankContext
from ._results import (
    LaunchedWorldUnreachable,
    RankError,
    RankFailure,
    RankResult,
    WorldError,
    WorldHang,
    WorldUnavailable,
    first_line,
)
from .like import WorldLike
from .local import World

__all__ = [
    "LaunchedWorldUnreachable",
    "ETHERNET_MTU",
    "LinkShape",
    "NetworkUnavailable",
    "PrivateNetwork",
    "RankContext",
    "RankError",
    "RankFailure",
    "RankResult",
    "World",
    "WorldError",
    "WorldHang",
    "WorldLike",
    "WorldUnavailable",
    "compile_cache_env",
    "first_line",
    "guardian",
    "loopback_interface",
    "proc_state",
    "process_running",
    "unavailable_reason",
]
