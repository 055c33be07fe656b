"""eval-equivalence's judge fed records directly (no world): the tolerance, the padding
arithmetic, and that a cause is named only when its measurement holds."""

from __future__ import annotations

import pytest

from conformance.checks.evaluation import tolerance, verdict
from conformance.checks.evaluation.records import (
    BufferSlice,
    EvalRank,
    ForwardSlice,
    StepSlice,
)
from conformance.harness.observe import CollectiveCall, CollectiveSlice, SamplerSeen, SamplesSlice

KEY = "TensorDataset[51]"


def _rank(rank: int, world: int, metrics: dict[str, float], indices: list[int], *, calls=(),
          sampler: SamplerSeen | None = None, train_mode=(), changed=()) -> EvalRank:
    return EvalRank(rank, world, metrics, None, "w", ForwardSlice(2, len(indices), 0, tuple(train_mode), ()),
                    SamplesSlice({KEY: tuple(indices)}, (sampler,) if sampler else ()),
                    CollectiveSlice(tuple(calls)), BufferSlice(6, tuple(changed)), StepSlice(ran=True))


def _strided(world: int, n: int = 51) -> list[list[int]]:
    return [list(range(r, n, world)) for r in range(world)]


REFERENCE = _rank(0, 1, {"accuracy": 0.5}, list(range(51)))


def test_tolerance_is_sqrt_n_float32_epsilons_of_the_value():
    assert tolerance(1.0, 100) == pytest.approx(10 * 2.0 ** -23 + 1e-12)
    assert tolerance(0.0, 10**6) == 1e-12  # an exact zero stays exact
    # ImageNet's 50 000 validation images on 7 ranks: DistributedSampler's 6 repeats move an
    # accuracy of 0.76 by ~2.9e-5, above the tolerance; one repeat (~4.8e-6) would not be.
    assert tolerance(0.76, 50_000) < 6 * 0.24 / 50_006
    assert tolerance(0.76, 50_000) > 0.24 / 50_001


def test_equal_within_tolerance_passes_and_beyond_it_fails_with_no_known_cause():
    shards = _strided(2)
    tol = tolerance(0.5, 51)
    close = [_rank(r, 2, {"accuracy": 0.5 + tol / 2}, shards[r]) for r in range(2)]
    assert verdict(close, REFERENCE).status == "passed"
    far = [_rank(r, 2, {"accuracy": 0.5 + 3 * tol}, shards[r]) for r in range(2)]
    outcome = verdict(far, REFERENCE)
    assert outcome.status == "failed"
    # Every sample once, the ranks agree, no all-reduce input explains it, eval mode: no cause.
    assert "no known cause matched" in outcome.message, outcome.message


def test_padding_named_with_the_samplers_arithmetic():
    padded = SamplerSeen(dataset_len=51, num_replicas=4, total_size=52, drop_last=False)
    shards = [list(range(r, 52, 4)) for r in range(4)]
    shards[3][-1] = 0  # DistributedSampler's padding: index 51 -> 0, the list's start again
    ranks = [_rank(r, 4, {"accuracy": 0.49}, shards[r], sampler=padded) for r in range(4)]
    outcome = verdict(ranks, REFERENCE)
    assert outcome.status == "failed"
    assert ("cause: padding duplicates: 51 samples on 4 ranks: DistributedSampler pads to 52, sample 0 counted "
            "twice") in outcome.message
    assert "pytorch/pytorch#25162" in (outcome.recommendation or "")


def test_repeats_forwarded_but_not_counted_pass_with_a_note():
    padded = SamplerSeen(dataset_len=51, num_replicas=2, total_size=52, drop_last=False)
    shards = [list(range(0, 52, 2)), [*range(1, 51, 2), 0]]
    ranks = [_rank(r, 2, {"accuracy": 0.5}, shards[r], sampler=padded) for r in range(2)]
    outcome = verdict(ranks, REFERENCE)
    assert outcome.status == "passed", outcome.message
    assert ("note: 51 samples on 2 ranks: DistributedSampler pads to 52, sample 0 forwarded twice — yet the "
            "metrics agree, so the repeats are not counted") in outcome.message


def test_mean_of_means_is_not_named_over_even_shards():
    """Equal shard sizes: the unweighted mean is the weighted one, so the hypothesis cannot be
    told from others and is not named (here the shards are even and a sample is missing)."""
    shards = [list(range(0, 50, 2)), list(range(1, 50, 2))]  # 25 + 25, sample 50 never evaluated
    calls = [(CollectiveCall("all_reduce", "SUM", (1,), (v,), (0.98,)),) for v in (0.5, 0.48)]
    ranks = [_rank(r, 2, {"accuracy": 0.49}, shards[r], calls=calls[r]) for r in range(2)]
    outcome = verdict(ranks, REFERENCE)
    assert outcome.status == "failed"
    assert "mean of per-rank means" not in outcome.message
    assert "cause: 1 of 51 samples never evaluated (first: 50)" in outcome.message


def test_train_mode_measured_without_a_metric_difference_still_fails():
    shards = _strided(2)
    ranks = [_rank(r, 2, {"accuracy": 0.5}, shards[r], train_mode=("bn",), changed=("bn.running_mean",))
             for r in range(2)]
    outcome = verdict(ranks, REFERENCE)
    assert outcome.status == "failed"
    assert outcome.message == "evaluate changed buffers on rank 0: bn.running_mean"
    assert "model.eval()" in (outcome.recommendation or "")


def test_different_weights_are_inconclusive_and_no_metrics_skip():
    ranks = [_rank(r, 2, {"accuracy": 0.5}, s) for r, s in enumerate(_strided(2))]
    other = EvalRank(**{**{f: getattr(REFERENCE, f) for f in REFERENCE.__dataclass_fields__}, "params_digest": "x"})
    assert verdict(ranks, other).status == "inconclusive"
    empty = EvalRank(**{**{f: getattr(REFERENCE, f) for f in REFERENCE.__dataclass_fields__}, "metrics": {}})
    assert verdict(ranks, empty).status == "skipped"


def test_repeats_within_a_tolerance_too_wide_to_resolve_them_are_inconclusive():
    n = 50_000
    padded = SamplerSeen(dataset_len=n, num_replicas=2, total_size=n + 2, drop_last=False)
    reference = EvalRank(**{**{f: getattr(REFERENCE, f) for f in REFERENCE.__dataclass_fields__},
                            "samples": SamplesSlice({KEY: tuple(range(n))}, ()), "metrics": {"accuracy": 0.76}})
    shards = [list(range(0, n, 2)) + [0], list(range(1, n, 2)) + [2]]
    ranks = [_rank(r, 2, {"accuracy": 0.76 + 1e-6}, shards[r], sampler=padded) for r in range(2)]
    outcome = verdict(ranks, reference)
    assert outcome.status == "inconclusive", outcome.message
    assert "cannot tell repeats counted from repeats removed" in outcome.message


def test_ranks_with_their_own_datasets_are_counted_by_rows():
    """Each rank built its own dataset (its shard): indices restart at 0 on every rank and say
    nothing about the 1-rank run's; rows are compared instead, and nothing is called missing."""
    ranks = [EvalRank(**{**{f: getattr(_rank(r, 2, {"accuracy": 0.5}, list(range(n))), f)
                            for f in REFERENCE.__dataclass_fields__},
                         "samples": SamplesSlice({f"TensorDataset[{n}]": tuple(range(n))}, ())})
             for r, n in ((0, 26), (1, 25))]
    outcome = verdict(ranks, REFERENCE)
    assert outcome.status == "passed", outcome.message
    assert "51 samples (26+25 per rank, by rows) against 51 on 1 rank" in outcome.message


def test_mean_of_means_and_no_reduction_are_named_from_the_reduced_values():
    shards = _strided(2)  # 26 + 25
    weighted = (26 * 0.6 + 25 * 0.4) / 51
    reference = EvalRank(**{**{f: getattr(REFERENCE, f) for f in REFERENCE.__dataclass_fields__},
                            "metrics": {"accuracy": weighted}})
    calls = [(CollectiveCall("all_reduce", "SUM", (1,), (v,), (1.0,)),) for v in (0.6, 0.4)]
    averaged = [_rank(r, 2, {"accuracy": 0.5}, shards[r], calls=calls[r]) for r in range(2)]
    outcome = verdict(averaged, reference)
    assert ("cause: mean of per-rank means over uneven shards: rank 0 0.6 over 26 samples, rank 1 0.4 over 25 "
            "samples averaged unweighted to 0.5; weighted by the samples they are 0.501961, the 1-rank value"
            in outcome.message), outcome.message
    own = [_rank(r, 2, {"accuracy": v}, shards[r]) for r, v in ((0, 0.6), (1, 0.4))]
    outcome = verdict(own, reference)
    assert ("cause: no reduction: each rank reports its own shard's value (rank 0 0.6 over 26 samples, rank 1 0.4 "
            "over 25 samples); weighted by the samples they are 0.501961, the 1-rank value, and evaluate called "
            "no collective" in outcome.message), outcome.message
    # The same values with a reference the weights do not explain: no cause is claimed.
    other = EvalRank(**{**{f: getattr(reference, f) for f in REFERENCE.__dataclass_fields__},
                        "metrics": {"accuracy": 0.7}})
    assert "no known cause matched" in verdict(averaged, other).message


def test_an_evaluate_that_returns_a_constant_is_skipped_never_passed():
    """``def evaluate(model, ctx): return {"accuracy": 0.5}``: equal on every world size, and it
    passed; no rank and not the 1-rank run forwarded the model, so nothing was compared."""
    idle = [EvalRank(r, 2, {"accuracy": 0.5}, None, "w", ForwardSlice(0, 0, 0, (), ()), SamplesSlice({}, ()),
                     CollectiveSlice(()), BufferSlice(6, ()), StepSlice(ran=True)) for r in range(2)]
    reference = EvalRank(0, 1, {"accuracy": 0.5}, None, "w", ForwardSlice(0, 0, 0, (), ()), SamplesSlice({}, ()),
                         CollectiveSlice(()), BufferSlice(6, ()), StepSlice(ran=False))
    outcome = verdict(idle, reference)
    assert outcome.status == "skipped"
    assert outcome.message == ("evaluate returned accuracy=0.5 without a forward of the model, on 2 ranks and on 1: "
                               "it evaluated nothing, so there is nothing to compare")


def _by_rows(rank: int, world: int, metrics: dict[str, float], rows: int, calls=()) -> EvalRank:
    """A rank whose evaluation sliced tensors of its own loader (no DataLoader, so no dataset
    indices): counted by rows."""
    return EvalRank(rank, world, metrics, None, "w", ForwardSlice(20, rows, 0, (), ()), SamplesSlice({}, ()),
                    CollectiveSlice(tuple(calls)), BufferSlice(6, ()), StepSlice(ran=True))


def test_a_fixed_number_of_eval_batches_per_rank_is_named_as_a_set_that_grows_with_the_world():
    """build-nanogpt's validation: val_loss_steps batches per rank, each rank from its own offset,
    then all-reduced AVG: 2 ranks evaluate 160 rows where 1 evaluates 80, and the loss moves."""
    reference = _by_rows(0, 1, {"val_loss": 4.855}, 80)
    calls = [(CollectiveCall("all_reduce", "AVG", (), (v,), (4.857,)),) for v in (4.86, 4.854)]
    ranks = [_by_rows(r, 2, {"val_loss": 4.857}, 80, calls[r]) for r in range(2)]
    outcome = verdict(ranks, reference)
    assert outcome.status == "failed"
    assert ("cause: the evaluated set grows with the world size: each of the 2 ranks forwarded 80 rows, as many "
            "as the 1-rank run, so 2 ranks evaluated 160 rows against 80" in outcome.message), outcome.message
    assert (outcome.recommendation or "").startswith("evaluate one fixed set whatever the world size")


def test_every_rank_evaluating_the_same_whole_set_is_not_called_a_growing_set():
    """The same rows on every rank (each evaluates the whole set) and a SUM where AVG was meant:
    the ranks' own values agree, so the set did not grow; the cause is elsewhere."""
    reference = _by_rows(0, 1, {"val_loss": 4.855}, 80)
    calls = (CollectiveCall("all_reduce", "SUM", (), (4.855,), (9.71,)),)
    ranks = [_by_rows(r, 2, {"val_loss": 9.71}, 80, calls) for r in range(2)]
    outcome = verdict(ranks, reference)
    assert outcome.status == "failed"
    assert "grows with the world size" not in outcome.message, outcome.message
