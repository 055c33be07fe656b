"""Correct target whose first optimizer step is skipped, as a GradScaler skips a step whose
fp16 gradients overflowed (typically the first ones): ``train_step`` does not call
``optimizer.step()`` at step 0. gradient-equivalence must compare the gradients of the first
step that ran (step 1) and pass — not report "no gradient reached the optimizer".

    ddp-conformance run --target tests/targets/skips_first_step.py --checks gradient-equivalence
"""

from __future__ import annotations

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

ddp_kwargs = {"find_unused_parameters": False}


def train_step(model, optimizer, microbatches, loss_fn, *, step):  # type: ignore[no-untyped-def]
    optimizer.zero_grad(set_to_none=True)
    for inputs, targets in microbatches:
        (loss_fn(model(inputs), targets) / len(microbatches)).backward()
    if step > 0:  # step 0 skipped, as GradScaler skips a step with inf gradients
        optimizer.step()
