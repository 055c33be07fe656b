"""Correct target: the built-in MLP with 1 KB gradient buckets (several buckets, another
summation order). Must pass: bucket_cap_mb changes rounding, not correctness.

    ddp-conformance run --target tests/targets/tiny_buckets.py --checks gradient-equivalence,no-sync-equivalence
"""

from __future__ import annotations

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

ddp_kwargs = {"find_unused_parameters": False, "bucket_cap_mb": 0.001}
