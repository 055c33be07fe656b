"""Byte sizes as text, one convention for every report, chart and message.

Binary multiples with their IEC names (KiB = 1024 B, MiB, GiB), because what is measured in
bytes here — all-reduce message sizes, gradient buckets, model gradients — comes in powers of
two, and ``bucket_cap_mb`` itself is MiB (DDP multiplies it by 1024 * 1024). Bandwidths stay
in decimal GB/s, the nccl-tests convention (``reports.charts``, ``conformance.perf``).
"""

from __future__ import annotations

_BINARY = ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))


def fmt_bytes(n: float) -> str:
    """``n`` bytes in the largest binary unit it reaches, e.g. ``4 KiB``, ``1.5 MiB``, ``512 B``."""
    for size, unit in _BINARY:
        if abs(n) >= size:
            # Three significant figures: a model's 1078888 bytes read "1.03 MiB", not "1.02891 MiB".
            value = n / size
            return f"{value:.0f} {unit}" if abs(value) >= 100 else f"{value:.3g} {unit}"
    return f"{n:g} B"
