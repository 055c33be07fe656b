"""``equivalence.schedule``: the learning rate each optimizer.step() used, against the reference's."""

from __future__ import annotations

import torch

from conformance.checks.equivalence.schedule import first_rate_mismatch, learning_rates


def test_rates_are_read_per_param_group_tensor_or_float():
    params = [torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))]
    optimizer = torch.optim.AdamW([{"params": [params[0]], "lr": 1e-3},
                                   {"params": [params[1]], "lr": torch.tensor(2e-3)}])
    assert learning_rates(optimizer) == [1e-3, float(torch.tensor(2e-3))]
    # Nothing to read: a hand-written optimizer (tests/targets/handwritten_optimizer.py), an lr that is no number.
    assert learning_rates(object()) is None
    assert learning_rates(type("Odd", (), {"param_groups": [{"lr": "warmup"}]})()) is None


def test_the_first_differing_step_and_rank_is_named_and_steps_without_a_step_are_skipped():
    ref = {"learning_rates": [[0.1], [0.09], [0.081]]}
    same = {"rank": 0, "learning_rates": [[0.1], [0.09], [0.081]]}
    assert first_rate_mismatch(ref, [same, {**same, "rank": 1}]) is None
    # A step one side did not take (a GradScaler skip) or other groups: not compared here.
    assert first_rate_mismatch(ref, [{"rank": 0, "learning_rates": [[0.1], None, [0.081, 1.0]]}]) is None
    late = {"rank": 1, "learning_rates": [[0.1], [0.09], [0.0729]]}
    early = {"rank": 0, "learning_rates": [[0.1], [0.081], [0.0729]]}
    found = first_rate_mismatch(ref, [late, early])
    assert found is not None and (found.step, found.rank, found.got, found.ref) == (1, 0, 0.081, 0.09)
    assert "at step 1 used learning rate 0.081 on rank 0 but 0.09" in found.message()


def test_a_rate_that_differs_under_a_random_forward_is_undecided_not_failed():
    # A schedule that follows the loss (ReduceLROnPlateau) parts with random draws alone.
    from conformance.checks.equivalence import judge
    from conformance.checks.equivalence.floor import Floor

    from .test_noise_floor import _equivalence

    eq = _equivalence(Floor(0.0, 0.0, 2), 0.0)
    eq.reference["learning_rates"] = [[0.1]]
    for record in eq.ranks:
        record["learning_rates"] = [[0.05]]
    failed = judge(eq, what="the DDP step", recommendation="r")
    assert failed is not None and failed.status == "failed"
    assert failed.evidence["learning_rate_mismatch"]["reference_lr"] == 0.1
    for record in eq.ranks:
        record["rng_in_forward"] = True
    undecided = judge(eq, what="the DDP step", recommendation="r")
    assert undecided is not None and undecided.status == "inconclusive", undecided.message
    assert "a schedule that follows the loss would part for that reason alone" in undecided.message
