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


# -- sampler-coverage judges the loop's own loaders ---------------------------------------------

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _record(session: Any, target: str) -> Any:
    from conformance.harness.registry import BY_ID

    record, _ = session.run_check(BY_ID["sampler-coverage"], target)
    return record


def test_trainer_loop_and_pipeline_are_both_judged(suite_session: Any) -> None:
    record = _record(suite_session, target_spec("trainer"))
    assert record.status == "passed", record.message
    assert ("judged: the pipeline as trainer.epoch_batches builds it and the training loop itself (run_loop), "
            "2 epochs (40/40 samples per epoch") in record.message, record.message
    loop = record.evidence["run_loop"]["loop"]
    assert loop["epochs_started_per_rank"] == [2, 2] and loop["batches_drawn_per_rank"] == [[2, 2], [2, 2]]
    assert record.metrics["loop_epochs"] == 2


def test_a_loop_without_epoch_batches_is_judged_itself(suite_session: Any) -> None:
    # examples/train_resume.py defines no epoch_batches: the check was skipped before.
    record = _record(suite_session, str(EXAMPLES / "train_resume.py"))
    assert record.status == "passed", record.message
    assert record.message.startswith("train_resume.run_loop: every sample once per epoch"), record.message
    assert "judged: the training loop itself (run_loop), 2 epochs (64/64 samples per epoch" in record.message
    assert record.evidence["judged"].startswith("the training loop itself (run_loop), 2 epochs")


def test_set_epoch_forgotten_in_the_loop_fails_though_epoch_batches_calls_it(suite_session: Any) -> None:
    record = _record(suite_session, target_spec("loop_no_set_epoch"))
    assert record.status == "failed", record.message
    assert ("loop_no_set_epoch.run_loop: the training loop's sampler repeated epoch 0's order in epoch 1: call "
            "sampler.set_epoch(epoch) before each epoch") in record.message, record.message
    assert record.evidence["run_loop"]["epochs_with_repeated_order"] == [1]
    assert record.evidence["epoch_batches"]["epochs_with_repeated_order"] == []  # its restatement is right


def test_correct_loop_passes(suite_session: Any) -> None:
    record = _record(suite_session, target_spec("loop_sampler"))
    assert record.status == "passed", record.message
    assert "the training loop itself (run_loop), 2 epochs" in record.message


def test_loop_loader_not_sharded_by_rank_fails(suite_session: Any) -> None:
    record = _record(suite_session, target_spec("loop_unsharded"))
    assert record.status == "failed", record.message
    # The loop seeds torch alike on every rank (torch.manual_seed(0)), so both shuffle alike too.
    assert ("loop_unsharded.run_loop: the training loop's DataLoader is not sharded by rank: every rank iterates "
            "the same 40 indices of TensorDataset[40] in the same order (RandomSampler)") in record.message, record.message


def test_loop_ignoring_the_epoch_cap_is_said_to_show_one_epoch(suite_session: Any) -> None:
    record = _record(suite_session, target_spec("loop_uncapped"))
    assert record.status == "passed", record.message
    assert "the training loop itself (run_loop), 1 epoch: it started only one epoch" in record.message
    assert record.metrics["loop_epochs"] == 1


def test_loop_without_a_dataloader_is_said_not_failed(suite_session: Any) -> None:
    record = _record(suite_session, target_spec("loop_no_loader"))
    assert record.status == "skipped", record.message
    assert "defines no epoch_batches(rank, world_size, epoch) and its run_loop iterates no DataLoader" in record.message


def test_pipeline_only_says_the_loop_was_not_observed(suite_session: Any) -> None:
    record = _record(suite_session, target_spec("tied-lm"))
    assert record.status == "passed", record.message
    assert "the training loop itself was not observed" in record.message
    assert "run_loop" not in record.evidence


def test_a_plain_shuffle_of_the_whole_dataset_on_every_rank_is_not_sharded() -> None:
    # Unseeded per rank (as under torchrun): other orders, every rank still holds every sample.
    from conformance.checks.sampling import RankEpoch
    from conformance.checks.sampling.loop import LOOP_IDENTITY, LoopEpochs, unsharded_problem

    built = {"sampler": "RandomSampler", "length": 6}
    orders = ([3, 1, 5, 0, 2, 4], [0, 4, 2, 5, 1, 3])
    found = LoopEpochs([[(RankEpoch(o, 2, built), LOOP_IDENTITY)] for o in orders], "TensorDataset[6]")
    said = unsharded_problem(found)
    assert said is not None and said.startswith(
        "the training loop's DataLoader is not sharded by rank: every rank iterates all 6 samples of "
        "TensorDataset[6] each epoch (RandomSampler)"), said
    sharded = LoopEpochs([[(RankEpoch(o[:3], 1, built), LOOP_IDENTITY)] for o in ([3, 1, 5], [0, 4, 2])], "x")
    assert unsharded_problem(sharded) is None


def test_the_loader_that_shuffles_is_judged_not_an_evaluation_before_it() -> None:
    from conformance.checks.sampling.loop import loop_epochs
    from conformance.harness.observe import LoaderEpoch

    evaluation = LoaderEpoch("TensorDataset[8]", tuple(range(8)), 1, 1, {"shuffles": False})
    training = [LoaderEpoch("TensorDataset[40]", tuple(range(r, 40, 2)), 5, 2, {"shuffles": True}) for r in (0, 1)]
    found = loop_epochs([(evaluation, training[0]), (evaluation, training[1])])
    assert found.dataset == "TensorDataset[40]" and found.others == ["TensorDataset[8]"]
    assert [ranks[0][0].ids for ranks in found.per_rank] == [list(range(0, 40, 2)), list(range(1, 40, 2))]
