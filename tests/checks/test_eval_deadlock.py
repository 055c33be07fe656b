"""eval-equivalence on an evaluate that deadlocks on every rank (issue 34 §5): each rank
receives from the next and none sends. The record names the N-rank deadlock — every rank, the
call it waited in, the user's line — never the 1-rank reference's error, where the same receive
has no peer to wait for and raises at once ("Pair is not connected")."""

from __future__ import annotations

import re

from conformance.harness.registry import BY_ID

from ._check_helpers import target_spec


def test_an_evaluate_deadlocked_on_every_rank_is_named_with_each_ranks_call(suite_session):
    record, _ = suite_session.run_check(BY_ID["eval-equivalence"], target_spec("eval_deadlock"))
    assert record.status == "failed", record.message
    assert re.match(r"^evaluate deadlocked on all 2 ranks: rank 0 in recv at \S*eval_deadlock\.py:16, rank 1 in "
                    r"recv at \S*eval_deadlock\.py:16; no rank raised first, each waited for a peer that never "
                    r"matched its call until the process group's timeout released it", record.message), record.message
    assert "reference" not in record.message
    assert record.metrics["stuck_ranks"] == [0, 1]
    calls = record.evidence["calls"]
    assert set(calls) == {"0", "1"} and all(call.startswith("recv at ") for call in calls.values()), calls
    assert "send" in (record.recommendation or "")
