"""One DDP error, one failed check (``conformance.harness.root_cause``), without a world: the
first failed record carrying a DDP error raised on the ranks becomes the target's root; later
records on that target that hit the same error become inconclusive, pointing at it; other
targets, other errors, passes and a check's own re-run remedies are left as they are.
(End to end: a siamese target under reentrant checkpointing went from 6 failed and 2
inconclusive checks on one RuntimeError to 1 failed, 1 failed with its own diagnosis, and the
rest 'blocked by gradient-equivalence'.)"""

from __future__ import annotations

from conformance.harness.outcome import Outcome
from conformance.harness.root_cause import BLOCKED_BY, RootCauses, signature
from ddp_conformance.reports.keys import REMEDIES

ERROR = ("raised RuntimeError: Expected to have finished reduction in the prior iteration before "
         "starting a new one. This error indicates that your module has parameters that were not used")


def _root() -> Outcome:
    return Outcome.failed(f"the DDP training step raised on rank 0: {ERROR}",
                          evidence={"rank_errors": {"0": ERROR}}, recommendation="use_reentrant=False")


def test_later_checks_hitting_the_same_ddp_error_are_blocked_by_the_first():
    roots = RootCauses()
    assert roots.relate("gradient-equivalence", "t.py", _root()).status == "failed"
    straggler = Outcome.inconclusive(f"the check itself failed: RankFailure: rank 1 {ERROR[:120]}",
                                     recommendation="unrelated advice")
    blocked = roots.relate("straggler", "t.py", straggler)
    assert blocked.status == "inconclusive"
    assert blocked.message.startswith("could not run: blocked by the DDP error that gradient-equivalence "
                                      "reports on this target (RuntimeError: Expected to have finished")
    assert blocked.evidence[BLOCKED_BY]["check"] == "gradient-equivalence"
    assert blocked.recommendation is not None and "unrelated" not in blocked.recommendation
    hang = roots.relate("hang-detection", "t.py", Outcome.failed(f"loop did not complete: RuntimeError: {ERROR[16:]}"))
    assert hang.status == "inconclusive"
    # Left alone: the root itself again, another target, another error, a pass, and a check
    # with its own re-run remedies (a diagnosis of its own).
    assert roots.relate("gradient-equivalence", "t.py", _root()).status == "failed"
    assert roots.relate("straggler", "other.py", straggler).status == "inconclusive"
    assert roots.relate("straggler", "other.py", straggler).message == straggler.message
    other = Outcome.failed("rank 1 raised ValueError: something else entirely happened here")
    assert roots.relate("no-sync-equivalence", "t.py", other) is other
    assert roots.relate("rank-consistency", "t.py", Outcome.passed("fine")).status == "passed"
    own = Outcome.failed(f"unused parameters: {ERROR}", evidence={REMEDIES: []})
    assert roots.relate("unused-parameters", "t.py", own).status == "failed"


def test_only_a_ddp_error_raised_on_the_ranks_becomes_a_root():
    roots = RootCauses()
    plain = Outcome.failed(f"gradients differ: {ERROR}")  # no rank_errors: not a raised run
    roots.relate("gradient-equivalence", "t.py", plain)
    assert roots.roots == {}
    assert signature("raised RuntimeError: short") is None  # too short to identify anything
    assert signature(ERROR) == "RuntimeError: " + ERROR[len("raised RuntimeError: "):][:60]


def test_a_second_equivalence_check_naming_the_same_error_is_blocked_too():
    roots = RootCauses()
    named = Outcome.failed("DDP cannot broadcast into buffer pe ...", evidence={"rank_errors": {"0": ERROR},
                                                                              REMEDIES: []})
    assert roots.relate("gradient-equivalence", "t.py", named).status == "failed"
    again = roots.relate("no-sync-equivalence", "t.py", named)
    assert again.status == "inconclusive" and again.evidence[BLOCKED_BY]["check"] == "gradient-equivalence"
