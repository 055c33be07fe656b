"""Reentrant activation checkpointing with DDP (conformance/checks/equivalence/checkpointing.py).

In process: the probe's recording and the forced ``use_reentrant=False`` patch the two
checkpoint implementations (whichever way a target imported ``checkpoint``) and put them back.
On the shared 2-rank gloo session: examples/train_checkpointed.py as shipped, and with reentrant
checkpointing alone, passes the equivalence checks (no false alarm) while a loss scaled by the
world size is still caught; its failing reentrant variants are named with both remedies re-run
(tests/examples/test_example_bugs.py holds the messages); a deliberately wrong remedy re-runs as
"did not fix" where the documented one is a verified fix.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from conformance.checks.equivalence.checkpointing import (
    Candidate,
    forced_nonreentrant,
    recorded_checkpoints,
    rerun,
)
from conformance.harness.registry import BY_ID
from conformance.harness.remedies import DID_NOT_FIX, VERIFIED, verify
from ddp_conformance.reports.keys import REMEDIES

from ..examples._variants import variant

REENTRANT_SHARED = [("USE_REENTRANT = False", "USE_REENTRANT = True"),
                    ("nn.ModuleList(Block(WIDTH) for _ in range(DEPTH))", "nn.ModuleList([Block(WIDTH)] * DEPTH)")]


class _Net(nn.Module):
    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.stem, self.block, self.head = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 1)
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.stem(x)
        h = checkpoint(self.block, h, use_reentrant=self.reentrant)  # a module
        h = torch.utils.checkpoint.checkpoint(self.block.forward, h, use_reentrant=self.reentrant)  # a method
        return self.head(h)


@pytest.mark.parametrize("reentrant", [True, False])
def test_the_probe_counts_checkpoint_calls_per_module_and_kind(reentrant: bool) -> None:
    model = _Net(reentrant)
    with recorded_checkpoints(model) as seen:
        model(torch.randn(2, 4)).sum().backward()
    kind, other = ("reentrant", "non_reentrant") if reentrant else ("non_reentrant", "reentrant")
    assert seen[kind] == {"block": 2} and seen[other] == {}
    assert model.block.weight.grad is not None


def test_forced_nonreentrant_reroutes_reentrant_calls_and_puts_everything_back() -> None:
    import torch.utils.checkpoint as cp

    apply_before, generator_before = cp.CheckpointFunction.apply, cp._checkpoint_without_reentrant_generator
    model = _Net(reentrant=True)
    with recorded_checkpoints(model) as seen, forced_nonreentrant():
        model(torch.randn(2, 4)).sum().backward()
    assert seen == {"reentrant": {}, "non_reentrant": {"block": 2}}
    # The persistent rank processes serve later checks: nothing of the patches may stay.
    assert cp.CheckpointFunction.apply == apply_before
    assert cp._checkpoint_without_reentrant_generator is generator_before
    assert "apply" not in cp.CheckpointFunction.__dict__


#: Correct configurations with checkpointing: reentrant alone is correct too (each block once,
#: every parameter used, find_unused_parameters=False), as is the example as shipped.
CORRECT_REENTRANT = {
    "reentrant": [("USE_REENTRANT = False", "USE_REENTRANT = True")],
    "non_reentrant": [],
}


@pytest.mark.parametrize("case", sorted(CORRECT_REENTRANT))
def test_correct_checkpointed_configurations_pass_and_a_scaled_loss_is_still_caught(suite_session, tmp_path,
                                                                               case: str) -> None:
    target = variant(tmp_path, "train_checkpointed.py", case, *CORRECT_REENTRANT[case])
    for check_id in ("gradient-equivalence", "no-sync-equivalence"):
        record, _ = suite_session.run_check(BY_ID[check_id], target)
        assert record.status == "passed", (check_id, record.message)
        assert REMEDIES not in record.evidence
    scaled = variant(tmp_path, "train_checkpointed.py", f"{case}_scaled", *CORRECT_REENTRANT[case],
                     ("loss = loss_fn(model(x), y) / k",
                      "loss = loss_fn(model(x), y) / k * torch.distributed.get_world_size()"))
    record, _ = suite_session.run_check(BY_ID["gradient-equivalence"], scaled)
    assert record.status == "failed" and "the loss is multiplied by the world size" in record.message, \
        record.message


def test_a_wrong_remedy_is_rerun_and_did_not_fix(suite_session, tmp_path) -> None:
    # find_unused_parameters=True does not stop a block applied four times per forward from
    # being reported four times: the re-run of the failing step raises DDP's error again.
    target = variant(tmp_path, "train_checkpointed.py", "reentrant_shared", *REENTRANT_SHARED)
    ctx = suite_session.context(BY_ID["gradient-equivalence"], target)
    wrong = Candidate("find_unused_parameters=True", {"find_unused_parameters": True})
    remedy = verify(wrong.change, partial(rerun, ctx, overrides=wrong.overrides, nonreentrant=wrong.nonreentrant))
    assert (remedy.change, remedy.status) == ("find_unused_parameters=True", "did not fix"), remedy
    assert remedy.evidence["completed"] is False
    assert "Expected to mark a variable ready only once" in remedy.evidence["error"]
    # The same re-run with the documented remedy: a verified fix (the world recovered).
    right = verify("use_reentrant=False", partial(rerun, ctx, overrides={}, nonreentrant=True))
    assert right.status == "verified fix" and right.evidence["microbatches_per_rank"] == 4, right


def test_static_graph_with_no_sync_accumulation_is_a_finding_not_the_users_error(suite_session, tmp_path) -> None:
    # torch 2.13's reducer asserts when static_graph meets no_sync (pytorch/pytorch#143580): the
    # accumulating example with static_graph=True fails the check, it is not a target error.
    target = variant(tmp_path, "train_checkpointed.py", "static_graph",
                     ('ddp_kwargs = {"find_unused_parameters": False}', 'ddp_kwargs = {"static_graph": True}'))
    record, _ = suite_session.run_check(BY_ID["no-sync-equivalence"], target)
    assert record.status == "failed", record.message
    assert "expect_autograd_hooks_ INTERNAL ASSERT FAILED" in record.message


def test_the_error_without_reentrant_checkpointing_is_not_named(suite_session) -> None:
    # DDP's "marked ready twice" on a target whose probe sees no reentrant checkpoint call (the
    # example as shipped: non-reentrant): no cause is named and nothing is re-run.
    from conformance.checks.equivalence.checkpointing import (
        CHECKPOINTING,
        MARKED_TWICE,
        name_checkpointing,
    )
    from conformance.harness.outcome import Outcome
    from conformance.harness.world import RankFailure
    from conformance.harness.world import RankError, RankResult

    from ..examples._variants import EXAMPLES

    ctx = suite_session.context(BY_ID["gradient-equivalence"], str(EXAMPLES / "train_checkpointed.py"))
    error = RankError("exception", f"RuntimeError: {MARKED_TWICE}. This error is caused by ...", exc_type="RuntimeError")
    exc = RankFailure("rank 0 raised", results=[RankResult(0, error=error), RankResult(1, error=error)])
    generic = Outcome.failed("the DDP training step raised on rank 0: ...", evidence={"rank_errors": {}})
    outcome = name_checkpointing(ctx, exc, generic)
    assert outcome.message == generic.message and REMEDIES not in outcome.evidence
    assert outcome.evidence[CHECKPOINTING]["calls"] == {"reentrant": {}, "non_reentrant": {f"blocks.{i}": 1
                                                                                          for i in range(4)},
                                                        "without_gradient": []}
    # Another DDP error is left alone without even probing.
    other = RankFailure("rank 0 raised", results=[RankResult(0, error=RankError("exception", "RuntimeError: boom"))])
    assert name_checkpointing(ctx, other, generic) is generic


def test_a_tower_that_never_gets_a_gradient_under_reentrant_checkpointing_is_named(suite_session) -> None:
    # A siamese tower checkpointed reentrantly on inputs that need no gradient: DDP raised
    # "Expected to have finished reduction ..." and the record said only that, raw. The probe
    # (no DDP) measures the tower's parameters without gradient; use_reentrant=False is verified
    # by a re-run in which they get one and match the reference.
    from ._check_helpers import run_check

    record = run_check(suite_session, "gradient-equivalence", "siamese_reentrant")
    assert record.status == "failed"
    assert record.message.startswith("reentrant activation checkpointing in tower with ddp_kwargs")
    assert ("measured without DDP: 4 parameter(s) (tower.0.weight, tower.0.bias, tower.2.weight, "
            "tower.2.bias) have no gradient after backward") in record.message
    assert "find_unused_parameters=True would hide the error, not train the block" in record.message
    remedies = {r["change"]: r for r in record.evidence[REMEDIES]}
    assert remedies["use_reentrant=False"]["status"] == VERIFIED
    assert remedies["use_reentrant=False"]["evidence"]["never_got_gradient"] == []
    assert remedies["static_graph=True"]["status"] == DID_NOT_FIX
