"""examples/train_amp_join.py: fp16 + GradScaler + Join over uneven shards.

rank-consistency's mid-run look passes the example (its scaler re-synced after each Join) and
catches the variant without the re-sync at the first step after the drift, naming the rank,
the parameter and both loss scales, although the parameters agree again at the end.

hang-detection runs the example's loop to completion and re-runs it with Join disabled to show
the hang Join prevents (rank 0, out of data, never enters the all-reduce rank 1 waits in); the
variant without Join fails, its message naming the uneven inputs it measured and its advice Join.
These two start a fresh world and wait out scenario timeouts: ~20-25 s each on 2 loaded cores."""

from __future__ import annotations

import re

import pytest

from conformance.harness.registry import BY_ID
from ddp_conformance.faults.scenarios import Scenario

from ._variants import EXAMPLES, variant

WITHOUT_RESYNC = ("        _resync_scaler(scaler, len(batches))\n", "")


def test_correct_scaler_resync_passes_mid_run(suite_session):
    record, _ = suite_session.run_check(BY_ID["rank-consistency"], str(EXAMPLES / "train_amp_join.py"))
    assert record.status == "passed", record.message
    midrun = record.evidence["midrun"]
    # Uneven shards (2 and 3 batches per epoch on ranks 0 and 1) in 2 Join blocks: the tails
    # were run and not compared with the other rank's next block.
    assert midrun["join_blocks"] == 2 and midrun["steps_per_rank"] == {"0": 4, "1": 6}
    assert midrun["checkpoints_compared"] == 7 and midrun["end_parameters_agree"] is True
    assert "GradScaler state bit-identical across ranks at 7 checkpoints" in record.message
    # The configuration table's rows this run verified (reports.keys.FEATURES).
    assert record.evidence["features"]["join"] == {"used": True, "value": "2 block(s) in run_loop",
                                                   "where": "run_loop (optimizer steps per rank: rank 0 4, rank 1 6)"}
    assert record.evidence["features"]["grad_scaler"]["used"] is True


def test_scale_drift_hidden_by_join_is_caught_mid_run(suite_session, tmp_path):
    target = variant(tmp_path, "train_amp_join.py", "no_resync", WITHOUT_RESYNC)
    record, _ = suite_session.run_check(BY_ID["rank-consistency"], target)
    assert record.status == "failed", record.message
    assert re.search(r"^mid-run drift across ranks in run_loop: at optimizer step 0 of Join block 2 \(rank 0's "
                     r"step 2, rank 1's step 3 of the loop\) parameter '0\.weight' differs between rank 0 and "
                     r"rank 1; loss scales rank 0 \d+ \(2\^\d+\), rank 1 \d+ \(2\^\d+\)", record.message), record.message
    assert "the parameters agree again on every rank (Join re-synced the model at exit)" in record.message
    first = record.evidence["midrun"]["first_difference"]
    assert first["scales"]["0"] != first["scales"]["1"]
    assert record.evidence["midrun"]["end_parameters_agree"] is True
    assert "GradScaler state identical on every rank" in record.recommendation


WITHOUT_JOIN = ("        with Join([model]):\n", "        if True:  # no Join\n")
NEVER_ENTERED = (r"divergence \(never-entered\): culprit rank 0 at collective #3 all_reduce.*\. rank 0 ran out of "
                 r"data after 2 training batches and left the loop; its peers went on into collective #3")


@pytest.mark.chaos
def test_join_completes_and_the_hang_without_it_is_shown(suite_session):
    record, _ = suite_session.run_check(BY_ID["hang-detection"], str(EXAMPLES / "train_amp_join.py"))
    assert record.status == "passed", record.message
    assert re.search(r"completed on every rank .*; uneven inputs \(rank 0 4, rank 1 6 batches\) are handled by "
                     r"Join: re-run with Join disabled, the loop hangs -- " + NEVER_ENTERED, record.message), \
        record.message
    join = record.evidence["join"]
    assert join["uneven_batches_per_rank"] == {"0": 4, "1": 6}
    assert (join["without_join"], join["culprit_rank"]) == ("divergence", 0)
    assert [e["scenario"] for e in record.evidence["scenarios"]] == ["target-run_loop", "target-run_loop-without-join"]
    assert record.metrics["key_figure"] == "no hang; Join prevents one"
    # In the report's configuration table, the Join row names the checks that verified it.
    from ddp_conformance.reports.configuration import tables

    table, = tables({"checks": [record.to_json()]})
    join_row = next(row for row in table.rows if row.feature == "Join")
    assert join_row.used and join_row.verified == "hang-detection passed", join_row


@pytest.mark.chaos
def test_uneven_inputs_without_join_named_with_join_advised(suite_session, tmp_path):
    target = variant(tmp_path, "train_amp_join.py", "no_join", WITHOUT_JOIN)
    record, _ = suite_session.run_check(BY_ID["hang-detection"], target)
    assert record.status == "failed", record.message
    assert re.search(r"did not complete -- uneven inputs: the ranks ran different numbers of training batches "
                     r"\(rank 0 2, rank 1 3\) with no Join around the loop -- " + NEVER_ENTERED, record.message), \
        record.message
    assert record.recommendation.startswith("The ranks run different numbers of batches (uneven inputs): wrap "
                                            "the loop in torch.distributed.algorithms.Join([model])")
    assert record.evidence["scenarios"][0]["batches_per_rank"] == {"0": 2, "1": 3}


def test_without_join_is_for_a_run_loop_only():
    with pytest.raises(ValueError, match=r"without_join applies to a target's run_loop only .*not to kind 'ddp'"):
        Scenario("x", "ddp", "target.py", without_join=True)


LOSS_LINE = "loss = loss_fn(model(inputs), targets) / k"


def test_fp16_scaler_step_passes_equivalence_and_a_world_size_scaled_loss_is_caught(suite_session, tmp_path):
    # The example's own configuration (fp16 autocast, GradScaler growth_interval=1) against its
    # measured noise floor: no false alarm; the loss multiplied by N is still caught, named.
    correct, _ = suite_session.run_check(BY_ID["gradient-equivalence"], str(EXAMPLES / "train_amp_join.py"))
    assert correct.status == "passed", correct.message
    scaled = variant(tmp_path, "train_amp_join.py", "times_world",
                     (LOSS_LINE, LOSS_LINE.replace(" / k", " * torch.distributed.get_world_size() / k")))
    record, _ = suite_session.run_check(BY_ID["gradient-equivalence"], scaled)
    assert record.status == "failed", record.message
    assert re.search(r"the loss is multiplied by the world size \(factor 2 = N\)", record.message), record.message


@pytest.mark.chaos
def test_a_loop_that_hangs_is_no_mid_run_pass(suite_session, tmp_path):
    # Without Join the loop hangs in its first epoch: the mid-run look compared the steps before
    # it and says what it could not compare (a fresh world with a 10 s process-group timeout,
    # so the hang neither reaches the shared world nor waits out the deadline).
    target = variant(tmp_path, "train_amp_join.py", "no_join", WITHOUT_JOIN)
    record, _ = suite_session.run_check(BY_ID["rank-consistency"], target)
    assert record.status == "inconclusive", record.message
    assert re.search(r"; run_loop did not complete on rank [01] \(.*\): its ranks agreed at the 2 checkpoints "
                     r"before that, the rest was not compared \(hang-detection diagnoses a loop that hangs\)",
                     record.message), record.message
    assert set(record.evidence["midrun"]["errors"]) == {"0", "1"}
    assert record.recommendation.startswith("Make run_loop complete on every rank (run hang-detection")


CORRUPT_RECORD = ("    return [make_batch(generator, BATCH) for _ in range(min(2 + rank, limit))]\n",
                  ("    batches = [make_batch(generator, BATCH) for _ in range(min(2 + rank, limit))]\n"
                   "    if rank == 1 and epoch == 0:  # a corrupt record at the end of rank 1's shard\n"
                   "        batches[-1] = (batches[-1][0] * 1e6, batches[-1][1])\n"
                   "    return batches\n"))


def test_a_step_skipped_on_inf_on_one_rank_only_is_named(suite_session, tmp_path):
    # Real data: rank 1's last batch of the first epoch overflows fp16; it is in Join's tail, so
    # only rank 1's scaler skips the step and halves its scale.
    target = variant(tmp_path, "train_amp_join.py", "corrupt_no_resync", WITHOUT_RESYNC, CORRUPT_RECORD)
    record, _ = suite_session.run_check(BY_ID["rank-consistency"], target)
    assert record.status == "failed", record.message
    assert "; steps skipped on inf/NaN gradients differ: rank 1 at optimizer step 2 of Join block 1" in record.message
    assert record.evidence["midrun"]["skipped_steps"] == {"1": ["optimizer step 2 of Join block 1"]}
    first = record.evidence["midrun"]["first_difference"]
    assert first["when"] == "optimizer step 0 of Join block 2" and first["scales"]["0"] != first["scales"]["1"]
