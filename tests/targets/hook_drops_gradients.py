"""BROKEN TARGET: the comm hook registered in ``configure_ddp`` hands back zeros instead of the
averaged gradients (a compression hook that forgot to decompress into the bucket). Every rank
then steps on zero gradients: gradient-equivalence must fail, which shows the target's hook
really reduces the buckets under the suite's counting hook.
"""

from __future__ import annotations

import torch

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401


def dropping_hook(state, bucket):  # type: ignore[no-untyped-def]
    future = torch.futures.Future()
    future.set_result(torch.zeros_like(bucket.buffer()))
    return future


def configure_ddp(ddp_model):  # type: ignore[no-untyped-def]
    ddp_model.register_comm_hook(state=None, hook=dropping_hook)
