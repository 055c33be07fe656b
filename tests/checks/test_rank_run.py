"""``RankRun``, the rank-side preamble every check starts from (conformance/harness/rank_run.py):
TF32 off, the model built from the suite's seed, handed to ``before_wrap`` before DDP sees it
(what it returns comes back as ``settled``), wrapped with the target's ``ddp_kwargs`` and the
overrides on top, and the optimizer over the wrapped model; the ``run_loop`` ctx wraps the
same way."""

from __future__ import annotations

from typing import Any

from conformance.harness.world import RankContext


def _rank_side(rank_ctx: RankContext) -> dict[str, Any]:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from conformance.harness.ddp import MODEL_SEED
    from conformance.harness.rank_run import RankRun

    torch.backends.cuda.matmul.allow_tf32 = True
    run = RankRun.load(rank_ctx, "mlp")
    out: dict[str, Any] = {"tf32": torch.backends.cuda.matmul.allow_tf32}
    torch.manual_seed(MODEL_SEED)
    expected = [p.detach().clone() for p in run.target.build_model().parameters()]

    def before_wrap(model: Any) -> list[Any]:
        out["wrapped_before"] = isinstance(model, DDP)
        return [p.detach().clone() for p in model.parameters()]

    wrapped = run.build_wrapped(ddp_overrides={"bucket_cap_mb": 1}, before_wrap=before_wrap)
    out["seeded"] = all(torch.equal(a, b) for a, b in zip(wrapped.settled, expected))
    out["wrapped"] = isinstance(wrapped.ddp, DDP) and wrapped.model is wrapped.ddp.module
    out["kwargs"] = wrapped.ddp_kwargs
    out["optimizer"] = type(wrapped.make_optimizer()).__name__
    loop = run.loop_context(steps=1, tmpdir=rank_ctx.tmpdir / f"rank-run-{rank_ctx.rank}")
    out["loop"] = (loop.rank, loop.world_size, loop.ddp_kwargs, loop.target is run.target)
    out["plain"] = run.build_wrapped().settled
    return out


def test_rank_run_builds_seeded_hands_over_then_wraps(suite_session):
    for result in suite_session.world().run(_rank_side):
        out = result.value
        assert out["tf32"] is False
        assert out["wrapped_before"] is False and out["seeded"] and out["wrapped"]
        # The mlp target's own ddp_kwargs, the override on top.
        assert out["kwargs"] == {"find_unused_parameters": False, "bucket_cap_mb": 1}
        assert out["optimizer"] == "SGD"
        assert out["loop"] == (result.rank, 2, {"find_unused_parameters": False}, True)
        assert out["plain"] is None
