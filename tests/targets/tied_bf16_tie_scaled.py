"""Broken target: tied_bf16 whose tied weight's gradient is multiplied by the launcher's world
size in a hook (an "average over ranks" fix applied to the tie alone, on top of DDP's own
average). Every other gradient is right, so the tied one stands out of bf16's rounding by
×WORLD_SIZE: shared-weights must fail naming it, even though the noise widens what passes.

    ddp-conformance run --target tests/targets/tied_bf16_tie_scaled.py --checks shared-weights
"""

from __future__ import annotations

import os

from torch import nn

from tied_bf16 import TiedBF16LM, forward_loss, make_batch  # noqa: F401


def build_model() -> nn.Module:
    model = TiedBF16LM()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    model.embed.weight.register_hook(lambda grad: grad * world)
    return model
