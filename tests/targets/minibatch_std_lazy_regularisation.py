"""BY DESIGN NOT EQUIVALENT, and correct about its communication: minibatch_std.py's
discriminator trained as StyleGAN trains it — accumulation with no_sync on the first K-1
microbatches and one optimizer step, then every other step a regularisation pass (a second
synchronised backward) with an optimizer step of its own. Two all-reduce rounds in such a call
are one per optimizer step: no-sync-equivalence must be inconclusive naming the mixing module,
never "2 all-reduce rounds per optimizer step".

    ddp-conformance run --target tests/targets/minibatch_std_lazy_regularisation.py --checks no-sync-equivalence
"""

from __future__ import annotations

import contextlib

from minibatch_std import build_model, ddp_kwargs, forward_loss, make_batch  # noqa: F401  (the target's own folder)

REGULARISE_EVERY = 2


def train_step(model, optimizer, microbatches, loss_fn, *, step):  # type: ignore[no-untyped-def]
    optimizer.zero_grad(set_to_none=True)
    for i, batch in enumerate(microbatches):
        last = i == len(microbatches) - 1
        with contextlib.nullcontext() if last else model.no_sync():
            (forward_loss(model, batch) / len(microbatches)).backward()
    optimizer.step()
    if step % REGULARISE_EVERY == 0:
        (real, _), _ = microbatches[0]
        optimizer.zero_grad(set_to_none=True)
        (0.1 * model(real).pow(2).mean()).backward()
        optimizer.step()
