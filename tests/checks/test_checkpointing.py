"""Reentrant activation checkpointing with DDP (conformance/checks/_checkpointing.py).

In process: the probe's recording and the forced ``use_reentrant=False`` patch the two
checkpoint implementations (whichever way a target imported ``checkpoint``) and put them back.
On the shared 2-rank gloo session: examples/train_checkpointed.py as shipped passes the
equivalence checks (no false alarm); its reentrant variants fail with the cause named and both
remedies re-run as "verified fix" (tests/examples/test_example_bugs.py holds the messages);
a deliberately wrong remedy re-runs as "did not fix".
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from conformance.checks import _checkpointing
from conformance.checks._checkpointing import (
    Candidate,
    forced_nonreentrant,
    recorded_checkpoints,
)
from conformance.harness.registry import BY_ID
from reports.keys import REMEDIES

from ..examples._variants import EXAMPLES, variant

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


def test_the_correct_checkpointed_example_passes_the_equivalence_checks(suite_session) -> None:
    target = str(EXAMPLES / "train_checkpointed.py")
    for check_id in ("gradient-equivalence", "no-sync-equivalence"):
        record, _ = suite_session.run_check(BY_ID[check_id], target)
        assert record.status == "passed", (check_id, record.message)
        assert REMEDIES not in record.evidence


def test_a_wrong_remedy_is_rerun_and_did_not_fix(suite_session, tmp_path, monkeypatch) -> None:
    # find_unused_parameters=True does not stop a block applied four times per forward from
    # being reported four times: the re-run raises DDP's error again.
    wrong = Candidate("find_unused_parameters=True", {"find_unused_parameters": True})
    monkeypatch.setattr(_checkpointing, "CANDIDATES", (wrong, *_checkpointing.CANDIDATES[1:]))
    target = variant(tmp_path, "train_checkpointed.py", "reentrant_shared", *REENTRANT_SHARED)
    record, _ = suite_session.run_check(BY_ID["gradient-equivalence"], target)
    assert record.status == "failed", record.message
    statuses = {r["change"]: r["status"] for r in record.evidence[REMEDIES]}
    assert statuses == {"find_unused_parameters=True": "did not fix", "use_reentrant=False": "verified fix"}
    assert "find_unused_parameters=True: did not fix (the re-run raised again: " in record.message
    assert "Expected to mark a variable ready only once" in record.message
    assert "verified here by re-running the failing step: use_reentrant=False" in (record.recommendation or "")
