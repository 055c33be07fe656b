"""BAD TARGET: configure_ddp calls a hook module function that does not exist (the stock hook
is ``fp16_compress_hook``): an AttributeError in the user's own configure_ddp."""

from __future__ import annotations

from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401


def configure_ddp(ddp_model):  # type: ignore[no-untyped-def]
    ddp_model.register_comm_hook(state=None, hook=default_hooks.fp16_compress)  # line 12: the mistake
