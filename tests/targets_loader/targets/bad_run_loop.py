"""BAD TARGET: run_loop reads a field the context does not have (ctx.local_rank): an
AttributeError in the user's own loop."""

from __future__ import annotations

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401


def run_loop(ctx):  # type: ignore[no-untyped-def]
    model = ctx.wrap(build_model())
    device = ctx.local_rank  # line 11: the mistake
    model(make_batch(None, 2)[0].to(device))
