"""The checks beyond the equivalence engine on targets that train through ``parallelize``
(FSDP2's ``fully_shard``, the composable ``replicate``): rank-consistency compares replicated
parameters bitwise and sharded ones as full tensors, DDP-only checks are skipped as not
applicable (never blocking ready), hang-detection records FSDP2's reductions (issue 40)."""

from __future__ import annotations

import re

import pytest

from conformance.harness.registry import BY_ID

from ..examples._variants import EXAMPLES
from ._check_helpers import target_spec

FSDP2 = str(EXAMPLES / "train_fsdp2.py")
REPLICATE = str(EXAMPLES / "train_replicate.py")


@pytest.mark.parametrize("target", [FSDP2, REPLICATE], ids=["fully_shard", "replicate_with_fsdp"])
def test_rank_consistency_passes_on_the_ports(suite_session, target):
    record, _ = suite_session.run_check(BY_ID["rank-consistency"], target)
    assert record.status == "passed", (record.status, record.message)
    # The run_loop's look too: every optimizer step compared, on every rank.
    assert "run_loop: parameters bit-identical across ranks at 5 checkpoints" in record.message, record.message
    # The optimizer's state of each shard laid out as its parameter, what every rank holds whole alike.
    assert "the optimizer state of 2 ranks' shards laid out as their parameters" in record.message, record.message


def test_rank_consistency_catches_a_build_only_ddp_broadcast_made_equal(suite_session):
    # DDP's construction broadcast copies rank 0's weights everywhere; FSDP2 does not.
    record, _ = suite_session.run_check(BY_ID["rank-consistency"], target_spec("fsdp2_rank_seeded_build"))
    assert record.status == "failed", (record.status, record.message)
    assert ("differs between rank 0 and rank 1 after replicate_with_fsdp (no broadcast: each rank's "
            "own build)") in record.message, record.message


@pytest.mark.parametrize("check_id", ["bucket-config", "unused-parameters"])
def test_ddp_only_checks_are_not_applicable_to_fsdp2(suite_session, check_id):
    record, _ = suite_session.run_check(BY_ID[check_id], FSDP2)
    assert record.status == "skipped", (record.status, record.message)
    assert record.message.startswith("not applicable to FSDP2: the target trains through parallelize"), record.message


def test_hang_detection_records_fsdp2_reductions(suite_session):
    record, _ = suite_session.run_check(BY_ID["hang-detection"], FSDP2)
    assert record.status == "passed", (record.status, record.message)
    # 4 optimizer steps x 3 parameter groups: FSDP2's reduce-scatters, recorded as they ran, and
    # named as what fully_shard issues (all-gathers before the forwards and backwards), not DDP's.
    assert re.search(r"4 optimizer steps, [1-9]\d* all-gathers and 12 reduce-scatters issued by FSDP2",
                     record.message), record.message
    assert "DDP all-reduce" not in record.message, record.message


def test_shared_weights_under_fully_shard(suite_session):
    # One DTensor shared by two modules: the full (summed over uses) gradient, gathered.
    record, _ = suite_session.run_check(BY_ID["shared-weights"], target_spec("fsdp2_tied"))
    assert record.status == "passed", (record.status, record.message)
    assert "1 shared parameter(s) (emb.weight) get the full gradient" in record.message, record.message


def test_shared_weights_split_over_two_fsdp_groups_is_fsdp2s_finding(suite_session):
    record, _ = suite_session.run_check(BY_ID["shared-weights"], target_spec("fsdp2_tied_split"))
    assert record.status == "failed", (record.status, record.message)
    assert "is shared with a parameter already managed by another FSDP group" in record.message, record.message


def test_split_clip_is_observed_before_it_hides_a_factor(suite_session):
    # torchtitan clips with get_total_norm + clip_grads_with_norm_: the gradients before that clip
    # are the ones compared, or a clip that engages on both sides hides the factor 1/N.
    record, _ = suite_session.run_check(BY_ID["gradient-equivalence"], target_spec("fsdp2_split_clip_hides_factor"))
    assert record.status == "failed", (record.status, record.message)
    assert "before clip_grad_norm_ the gradient of" in record.message, record.message
    assert "factor 1/2" in record.message, record.message


@pytest.mark.parametrize("check_id", ["gradient-equivalence",
                                      pytest.param("rank-consistency", marks=pytest.mark.slow)])
def test_premul_sum_on_gloo_is_inconclusive_needing_nccl(suite_session, check_id):
    # set_gradient_divide_factor(1.0) makes FSDP2 reduce-scatter with PREMUL_SUM, which gloo
    # lacks: the backend's limit, neither the target's bug nor a pass.
    record, _ = suite_session.run_check(BY_ID[check_id], target_spec("fsdp2_divide_factor"))
    assert record.status == "inconclusive", (record.status, record.message)
    assert "could not run: needs nccl: PREMUL_SUM reduce-scatter is not available on gloo" in record.message, \
        record.message
    assert record.recommendation is not None and "--backend nccl" in record.recommendation


def test_rank_consistency_catches_one_rank_skipping_its_optimizer_step(suite_session):
    # Rank 1's local loss trips a spike guard: its shards stop training. The gathered parameters
    # agree on every rank (each gathers every shard); the optimizer state does not.
    record, _ = suite_session.run_check(BY_ID["rank-consistency"], target_spec("fsdp2_local_spike_guard"))
    assert record.status == "failed", (record.status, record.message)
    assert re.search(r"optimizer state '0\.weight:\w+' differs between rank 0 and rank 1 after step 0 "
                     r"\(rank 1 has none: that rank's optimizer did not step this parameter\)",
                     record.message), record.message
    assert "reduced over all ranks" in (record.recommendation or "")


def test_eval_equivalence_through_parallelize_passes_a_correct_evaluate(suite_session):
    # evaluate gets what parallelize returned; its weight norm gathers the shards (full_tensor).
    record, _ = suite_session.run_check(BY_ID["eval-equivalence"], target_spec("fsdp2_eval"))
    assert record.status == "passed", (record.status, record.message)
    assert "3 metric(s) (loss, accuracy, weight_norm) on 2 ranks equal the 1-rank run" in record.message, \
        record.message


def test_eval_equivalence_catches_an_evaluate_reading_local_shards(suite_session):
    # The DDP version's p.norm() became p.to_local().norm(): each rank logs its own slice's norm.
    record, _ = suite_session.run_check(BY_ID["eval-equivalence"], target_spec("fsdp2_eval_local_shards"))
    assert record.status == "failed", (record.status, record.message)
    assert re.search(r"metric 'weight_norm' differs across ranks .* — cause: evaluate read this rank's shard "
                     r"of \d+ FSDP2-sharded parameter\(s\) \(.*0\.weight.*\) with to_local\(\)", record.message), \
        record.message
    assert "p.full_tensor()" in (record.recommendation or "")


def test_node_health_on_a_fully_shard_target_checks_the_node_through_ddp(suite_session):
    # The node's all-reduce is digested bucket by bucket through DDP: FSDP2 has no bucket (the
    # check raised AttributeError on FSDPNet.module and failed a healthy node).
    record, _ = suite_session.run_check(BY_ID["node-health"], FSDP2)
    assert record.status == "passed", (record.status, record.message)
    assert re.search(r"node healthy: 2 ranks agree bitwise on \d+ tensors .* and on [1-9]\d* all-reduced buckets",
                     record.message), record.message
