"""Performance and scale: bus bandwidth, the alpha-beta fit, the overlapped-step simulator and
scaling projection, and DDP's own overlap accounting. Pure math lives in ``busbw``,
``alphabeta`` and ``simulator``; ``sweep``, ``profile`` and ``overlap`` hold the work
functions that run on ranks (module-level, so a World can pickle them by reference)."""

from __future__ import annotations

from .alphabeta import AlphaBeta, fit_alpha_beta, ring_allreduce_time
from .bandwidth import SweepPoint, algbw, bus_factor, busbw, key_figure, median_of_slowest, nccl_tests_table
from .simulator import (
    BackwardProfile,
    Projection,
    StepTiming,
    ddp_bucket_caps,
    greedy_buckets,
    project,
    simulate,
    simulate_layers,
    step_at,
)

__all__ = [
    "AlphaBeta",
    "BackwardProfile",
    "Projection",
    "StepTiming",
    "SweepPoint",
    "algbw",
    "bus_factor",
    "busbw",
    "ddp_bucket_caps",
    "fit_alpha_beta",
    "greedy_buckets",
    "key_figure",
    "median_of_slowest",
    "nccl_tests_table",
    "project",
    "ring_allreduce_time",
    "simulate",
    "simulate_layers",
    "step_at",
]
