"""The built-in mlp with DDP's gradients as views into its buckets (``gradient_as_bucket_view``):
the all-reduce then overwrites the local gradients themselves, so node-health keeps a copy of
them to fetch a differing one's elements after the backward."""

from __future__ import annotations

from conformance.targets.mlp import build_model, loss_fn, make_batch

__all__ = ["build_model", "ddp_kwargs", "loss_fn", "make_batch"]

ddp_kwargs = {"find_unused_parameters": False, "gradient_as_bucket_view": True}
