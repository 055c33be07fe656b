"""sampler-coverage on the training loop itself: the run_loop context's epoch fields
(``ctx.epochs``, ``ctx.steps_per_epoch``) honoured by the built-in ``trainer``, so an epoch
boundary is crossed in a few steps."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ._check_helpers import target_spec


def _indices_trained(rank_ctx: Any, spec: str, epochs: int, steps_per_epoch: int) -> list[int]:
    """Rank side: the target's run_loop with the epoch fields set; the indices its loaders fetched."""
    from conformance.harness.observe import LoaderIndices, Observation
    from conformance.harness.rank_run import RankRun

    run = RankRun.load(rank_ctx, spec)
    loop = run.loop_context(steps=epochs * steps_per_epoch, epochs=epochs, steps_per_epoch=steps_per_epoch,
                            tmpdir=Path(rank_ctx.tmpdir) / f"loop-epochs-{rank_ctx.rank}")
    probe = LoaderIndices(fetched=True)
    assert run.target.run_loop is not None
    Observation([probe]).run(lambda: run.target.run_loop(loop))  # type: ignore[misc]
    return [i for indices in probe.result()["samples"].indices.values() for i in indices]


def test_trainer_run_loop_crosses_an_epoch_in_a_few_steps(suite_session: Any) -> None:
    from torch.utils.data import DistributedSampler

    from conformance.targets import trainer

    got = [r.value for r in suite_session.world().run(_indices_trained, target_spec("trainer"), 2, 2)]
    for rank, indices in enumerate(got):
        want = []
        for epoch in range(2):  # the first 2 batches of each epoch, in that epoch's order
            sampler = DistributedSampler(range(trainer.SAMPLES), num_replicas=2, rank=rank, seed=0)  # type: ignore[arg-type]
            sampler.set_epoch(epoch)
            want += list(sampler)[:2 * trainer.BATCH]
        assert indices == want, (rank, indices, want)
