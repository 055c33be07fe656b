"""BROKEN: nanoGPT-style accumulation that sets ``require_backward_grad_sync`` *after* the
forward of each micro-step. DDP reads the flag in ``forward`` (that is where it prepares the
reducer for a synchronising backward), so the last micro-step's backward runs with the flag the
previous micro-step left (False): the step ends without any all-reduce, and the next step's
*first* micro-step synchronises instead. no-sync-equivalence must fail and say that the step
whose gradients were compared ran 0 bucket all-reduces.

    ddp-conformance run --target tests/targets/sync_flag_after_forward.py --checks no-sync-equivalence
"""

from __future__ import annotations

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

ddp_kwargs = {"find_unused_parameters": False}


def train_step(model, optimizer, microbatches, loss_fn):  # type: ignore[no-untyped-def]
    k = len(microbatches)
    for i, (inputs, targets) in enumerate(microbatches):
        loss = loss_fn(model(inputs), targets) / k
        model.require_backward_grad_sync = i == k - 1  # the bug: set after the forward
        loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
