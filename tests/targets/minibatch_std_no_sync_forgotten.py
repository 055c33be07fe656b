"""BROKEN (wasteful) on top of a design limit: minibatch_std.py (a minibatch standard deviation
layer: by design not equivalent to the large-batch step) accumulating without no_sync, so
every microbatch's backward all-reduces. The gradients cannot be judged (the mixing), the
all-reduce rounds can: no-sync-equivalence must fail on the rounds, saying the gradients were
not judged and why.

    ddp-conformance run --target tests/targets/minibatch_std_no_sync_forgotten.py --checks no-sync-equivalence
"""

from __future__ import annotations

from minibatch_std import build_model, ddp_kwargs, forward_loss, make_batch  # noqa: F401  (the target's own folder)


def train_step(model, optimizer, microbatches, loss_fn):  # type: ignore[no-untyped-def]
    optimizer.zero_grad(set_to_none=True)
    for batch in microbatches:  # the bug: no model.no_sync() on the first K-1
        (forward_loss(model, batch) / len(microbatches)).backward()
    optimizer.step()
