"""Performance and scale: the ``allreduce-bandwidth`` check and the maths beside it.

Pure maths: ``bandwidth_math`` (nccl-tests bus bandwidth), ``alphabeta`` (the ring model fit)
and ``simulator`` (the overlapped DDP step and the scaling projection). Rank-side work
functions (module-level, so a World pickles them by reference): ``sweep``, ``profile`` and
``overlap``. The check itself: ``allreduce_bandwidth``."""

from __future__ import annotations

from .alphabeta import AlphaBeta, fit_alpha_beta, ring_allreduce_time
from .bandwidth_math import (
    SweepPoint,
    algbw,
    bus_factor,
    busbw,
    key_figure,
    median_of_slowest,
    nccl_tests_table,
)
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
