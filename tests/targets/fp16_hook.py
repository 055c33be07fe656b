"""Correct target: the built-in MLP with DDP's stock fp16 gradient compression, registered
where production registers it, right after wrapping (``configure_ddp``). Every check must run
without "register_comm_hook ... can only be called once": the suite's own hooks compose with it.

    ddp-conformance run --target tests/targets/fp16_hook.py --checks no-sync-equivalence
"""

from __future__ import annotations

from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401


def configure_ddp(ddp_model):  # type: ignore[no-untyped-def]
    ddp_model.register_comm_hook(state=None, hook=default_hooks.fp16_compress_hook)
