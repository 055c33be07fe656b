"""The judges on plain data: DDP error parsing, hang classification, straggler scoring."""

from __future__ import annotations

from ddp_conformance.faults.diagnosis import (
    RankState,
    barrier_culprits,
    diagnose_hang,
    score_stragglers,
    unused_from_error,
)

DDP_ERROR = (
    "RuntimeError: Expected to have finished reduction in the prior iteration before starting a new one.\n"
    "Parameters which did not receive grad for rank 1: aux_head.2.bias, aux_head.2.weight\n"
    "Parameter indices which did not receive grad for rank 1: 6 7\n")


def _enq(seq, tag, shape=(8,), bucket=None, params=()):  # type: ignore[no-untyped-def]
    return {"event": "enqueued", "seq": seq, "op": "all_reduce", "shape": list(shape), "tag": tag,
            "step": 0, "bucket": bucket, "params": list(params)}


def _done(seq):  # type: ignore[no-untyped-def]
    return {"event": "completed", "seq": seq}


def test_unused_names_parsed_from_ddp_error() -> None:
    assert unused_from_error(DDP_ERROR) == {1: ["aux_head.2.bias", "aux_head.2.weight"]}
    only_indices = DDP_ERROR.splitlines()[0] + "\n" + DDP_ERROR.splitlines()[2]
    assert unused_from_error(only_indices) == {1: ["#6", "#7"]}


def test_monitored_barrier_names_ranks() -> None:
    assert barrier_culprits("Ranks 1, 3 failed to pass monitoredBarrier in 1000 ms") == [1, 3]


def test_never_entered_bucket_names_rank_bucket_and_params() -> None:
    logs = {0: [_enq(1, "s0/b0", bucket=0, params=["head.w"]), _done(1),
                _enq(2, "s1/b0", bucket=0, params=["aux.w", "aux.b"])],
            1: [_enq(1, "s0/b0", bucket=0, params=["head.w"]), _done(1)]}
    d = diagnose_hang(logs, [RankState(0, "raised", "Timed out"), RankState(1, "raised", DDP_ERROR)])
    assert (d.classification, d.kind, d.culprit_rank) == ("divergence", "never-entered", 1)
    assert d.collective["bucket"] == 0 and d.params == ["aux.w", "aux.b"]
    assert d.unused == {1: ["aux_head.2.bias", "aux_head.2.weight"]}
    assert "rank 1" in d.describe() and "aux.w" in d.describe()


def test_skipped_collective_is_named() -> None:
    logs = {0: [_enq(1, "step0"), _done(1), _enq(2, "step1"), _done(2), _enq(3, "step2")],
            1: [_enq(1, "step0"), _done(1), _enq(2, "step2"), _done(2)]}
    d = diagnose_hang(logs, [RankState(0, "raised", "timeout"), RankState(1, "ok")])
    assert (d.kind, d.culprit_rank, d.collective["tag"]) == ("skipped-collective", 1, "step1")


def test_shape_mismatch_culprit_is_the_odd_shape() -> None:
    logs = {0: [_enq(1, "step0"), _done(1), _enq(2, "step1")],
            1: [_enq(1, "step0"), _done(1), _enq(2, "step1", shape=(16,))]}
    d = diagnose_hang(logs, [RankState(0, "died", "", -6), RankState(1, "raised", "reset")])
    assert (d.kind, d.culprit_rank) == ("shape-mismatch", 1)


def test_dead_rank_and_transport_and_clean() -> None:
    logs = {0: [_enq(1, "s0/b0", bucket=0, params=["w"])], 1: [_enq(1, "s0/b0", bucket=0, params=["w"])]}
    dead = diagnose_hang(logs, [RankState(0, "raised", "Connection reset"), RankState(1, "died", "", 1)])
    assert (dead.classification, dead.culprit_rank, dead.params) == ("dead-rank", 1, ["w"])
    stuck = diagnose_hang(logs, [RankState(0, "stuck"), RankState(1, "stuck")])
    assert stuck.classification == "transport"
    clean = {r: [_enq(1, "s0"), _done(1)] for r in (0, 1)}
    assert diagnose_hang(clean, [RankState(0, "ok"), RankState(1, "ok")]).classification == "none"


# -- never entered (application divergence) vs entered, never completed (transport) --------

BARRIER_NAMES_1 = "monitored_barrier: [Rank 0]: Ranks 1 failed to pass monitoredBarrier in 3000 ms"
TIMED_OUT = "RuntimeError: Timed out waiting 2000ms for recv operation to complete"


def _fr(seq_done: int, seq_enq: int, op: str = "gloo:all_reduce"):  # type: ignore[no-untyped-def]
    """A flight-recorder summary (faults._flight.summarize) for one group "2"."""
    pending = None if seq_enq <= seq_done else {"pg": "2", "seq": seq_enq, "op": op, "input_sizes": [[8]],
                                                "state": "scheduled", "retired": False, "p2p": False}
    return {"version": "2.10", "entries": [],
            "groups": {"2": {"last_enqueued": seq_enq, "last_completed": seq_done, "pending": pending}}}


def test_rank_that_never_entered_is_divergence_not_transport() -> None:
    # rank 1 completed step0, then was elsewhere: it never enqueued #2, which rank 0 waits in.
    logs = {0: [_enq(1, "step0"), _done(1), _enq(2, "step1")], 1: [_enq(1, "step0"), _done(1)]}
    d = diagnose_hang(logs, [RankState(0, "raised", f"{TIMED_OUT}\n{BARRIER_NAMES_1}"),
                             RankState(1, "stuck", "did not finish within the 8 s deadline")],
                      flight={0: _fr(1, 2)})
    assert (d.classification, d.kind, d.culprit_rank) == ("divergence", "never-entered", 1)
    assert d.collective["tag"] == "step1" and "never entered collective #2" in d.detail


def test_every_rank_entered_none_completed_is_transport_named_by_the_barrier() -> None:
    logs = {r: [_enq(1, "step0"), _done(1), _enq(2, "step1")] for r in (0, 1)}
    d = diagnose_hang(logs, [RankState(0, "raised", f"{TIMED_OUT}\n{BARRIER_NAMES_1}"),
                             RankState(1, "stuck", "did not finish within the 8 s deadline")],
                      flight={0: _fr(1, 2)})
    assert (d.classification, d.kind, d.culprit_rank) == ("transport", "entered-never-completed", 1)
    assert d.barrier == [1] and d.collective["tag"] == "step1" and d.collective["seq"] == 2
    assert "named by the monitored barrier" in d.detail
    # the flight recorder is the second source: rank 0 entered #2 and never completed it
    assert d.flight == {0: _fr(1, 2)["groups"]["2"]["pending"]}
    assert "rank 0 entered gloo:all_reduce #2" in d.detail and "disagrees" not in d.detail
    assert d.as_dict()["flight_recorder"]["0"]["seq"] == 2


def test_transport_culprit_without_a_barrier_answer_is_the_rank_no_timeout_released() -> None:
    # Rank 0 collects the barrier's acks, so a frozen rank 0 is never named by it; then the
    # rank that never came back while its peer's timeout released it is the culprit.
    logs = {r: [_enq(1, "step0"), _done(1), _enq(2, "step1")] for r in (0, 1)}
    d = diagnose_hang(logs, [RankState(0, "stuck", "did not finish; it did not answer the stack request"),
                             RankState(1, "raised", TIMED_OUT)])
    assert (d.classification, d.culprit_rank) == ("transport", 0)
    assert "the only rank no timeout released" in d.detail
    both = diagnose_hang(logs, [RankState(0, "stuck"), RankState(1, "stuck")])
    assert (both.classification, both.culprit_rank) == ("transport", None)


def test_flight_recorder_disagreement_is_reported() -> None:
    logs = {r: [_enq(1, "step0"), _done(1), _enq(2, "step1")] for r in (0, 1)}
    d = diagnose_hang(logs, [RankState(0, "raised", f"{TIMED_OUT}\n{BARRIER_NAMES_1}"), RankState(1, "stuck")],
                      flight={0: _fr(2, 2)})
    assert d.classification == "transport" and d.flight == {0: None}
    assert "rank 0 completed everything it entered (the tracker disagrees)" in d.detail


def test_straggler_is_most_compute_least_wait() -> None:
    v = score_stragglers({0: [0.01] * 5, 1: [0.06] * 5}, {0: [0.05] * 5, 1: [0.001] * 5},
                         {0: [0.061] * 5, 1: [0.061] * 5})
    assert v.culprit_rank == 1 and abs(v.cost_s - 0.05) < 1e-6
    balanced = score_stragglers({0: [0.010] * 5, 1: [0.011] * 5}, {0: [0.001] * 5, 1: [0.0] * 5},
                                {0: [0.011] * 5, 1: [0.011] * 5})
    assert balanced.culprit_rank is None
