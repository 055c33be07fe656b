"""Correct target whose forward_loss checks its own weight tie (as some trainers assert at
every step). The shared-weights per-use probe unties the tie on a copy — the suite's own
surgery, not how the target trains — so that probe cannot run here: it must be skipped with
its reason while the DDP comparison still passes, never a failed check or a target error.

    ddp-conformance run --target tests/targets/tied_reads_its_tie.py --checks shared-weights
"""

from __future__ import annotations

from typing import Any

import torch

from conformance.targets.tied_lm import build_model, loss_fn, make_batch  # noqa: F401


def forward_loss(model: Any, microbatch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    inner = getattr(model, "module", model)
    if inner.lm_head.weight is not inner.embed.weight:
        raise RuntimeError("the embedding and the output projection must share one weight")
    inputs, targets = microbatch
    return loss_fn(model(inputs), targets)
