"""Fixtures of the fault-injector and chaos-check tests."""

from __future__ import annotations

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent


def fault_target(name: str) -> str:
    """Absolute path of a target under tests/faults/targets/ (broken or correct on purpose)."""
    return str(HERE / "targets" / f"{name}.py")


def child_pids() -> set[int]:
    """Live processes whose parent is this process (from /proc, no psutil), less the zygote
    that forks every CPU world's ranks and outlives them (conformance/harness/world/_zygote.py)."""
    from conformance.harness.world._zygote import zygote_pids

    me, out = os.getpid(), set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me and fields[0] != "Z":
            out.add(int(entry.name))
    return out - set(zygote_pids())
