"""The perf checks' pure maths: ``bandwidth`` (nccl-tests bus bandwidth and its table),
``alphabeta`` (the ring all-reduce's latency/bandwidth model, fitted to a sweep) and
``simulator`` (the bucketed, overlapped DDP step and the scaling projection it implies).
Nothing here imports torch or runs on a rank."""

from __future__ import annotations

from .alphabeta import AlphaBeta, fit_alpha_beta, ring_allreduce_time
from .bandwidth import SweepPoint, algbw, bus_factor, busbw, key_figure, median_of_slowest, nccl_tests_table
from .simulator import (
    MB,
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

__all__ = ["MB", "AlphaBeta", "BackwardProfile", "Projection", "StepTiming", "SweepPoint", "algbw", "bus_factor",
           "busbw", "ddp_bucket_caps", "fit_alpha_beta", "greedy_buckets", "key_figure", "median_of_slowest",
           "nccl_tests_table", "project", "ring_allreduce_time", "simulate", "simulate_layers", "step_at"]
