"""Correct target: the nanoGPT step order — accumulation by toggling
``model.require_backward_grad_sync`` (only the last microbatch synchronises), the loss divided
by K, and ``optimizer.zero_grad(set_to_none=True)`` *after* ``optimizer.step()``, which leaves
no ``.grad`` behind. The equivalence checks must judge the gradients the optimizer consumed,
and pass.

    ddp-conformance run --target tests/targets/nanogpt_order.py --checks gradient-equivalence,no-sync-equivalence
"""

from __future__ import annotations

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

ddp_kwargs = {"find_unused_parameters": False}


def train_step(model, optimizer, microbatches, loss_fn):  # type: ignore[no-untyped-def]
    k = len(microbatches)
    for i, (inputs, targets) in enumerate(microbatches):
        # nanoGPT: only the last micro-step's backward all-reduces.
        model.require_backward_grad_sync = i == k - 1
        (loss_fn(model(inputs), targets) / k).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)  # after the step: no .grad is left to inspect
