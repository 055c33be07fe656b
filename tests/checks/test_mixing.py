"""A model whose forward mixes samples outside BatchNorm (a minibatch standard deviation, as
StyleGAN's discriminator has) is named as such: the probe (``equivalence.mixing``) finds the
module in the forwards the loss measurement already runs, the loss is then not blamed, the
floor's twin is no floor, and gradient-equivalence, no-sync-equivalence and shared-weights are
inconclusive naming the module (before: "the loss is not a mean over samples", "no known cause
matched" and "shared parameter ... gets a gradient wrong"). A factor of N on top is still named."""

from __future__ import annotations

import pytest

from conformance.checks.equivalence.floor import twin_floor
from conformance.checks.equivalence.hypotheses import loss_split, split_weighting
from conformance.checks.equivalence.mixing import first_mixing, row_prints

from ._check_helpers import target_spec
from .test_noise_floor import _c, _runs


def _std_feature(x):  # type: ignore[no-untyped-def]
    """StyleGAN's minibatch std: over strided groups of min(batch, 4) samples, one feature."""
    import torch

    group = min(x.shape[0], 4)
    std = (x.view(group, -1, x.shape[1]).var(0, unbiased=False) + 1e-8).sqrt().mean(1)
    return torch.cat([x, std.repeat(group)[:, None]], 1)


def _models():  # type: ignore[no-untyped-def]
    import torch
    from torch import nn

    class Std(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return _std_feature(x)

    class InModule(nn.Module):  # the statistic is a module of its own
        def __init__(self) -> None:
            super().__init__()
            self.features, self.stddev, self.head = nn.Linear(8, 16), Std(), nn.Linear(17, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(torch.relu(self.stddev(self.features(x))))

    class InForward(nn.Module):  # rosinality's Discriminator: computed in the model's own forward
        def __init__(self) -> None:
            super().__init__()
            self.features, self.head = nn.Linear(8, 16), nn.Linear(17, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(torch.relu(_std_feature(self.features(x))))

    class PerSample(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.features, self.norm, self.head = nn.Linear(8, 64), nn.LayerNorm(64), nn.Linear(64, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(torch.relu(self.norm(self.features(x))))

    class WithBatchNorm(nn.Module):  # BatchNorm's statistics: left to its own handling
        def __init__(self) -> None:
            super().__init__()
            self.features, self.norm, self.head = nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(torch.relu(self.norm(self.features(x))))

    torch.manual_seed(0)
    return {"module": InModule(), "forward": InForward(), "per-sample": PerSample(), "batchnorm": WithBatchNorm()}


def _probe(model, x, parts):  # type: ignore[no-untyped-def]
    import torch

    size = x.shape[0] // parts
    with torch.no_grad(), row_prints(model, rows=x.shape[0]) as whole:
        model(x)
    pieces = []
    for i in range(parts):
        with torch.no_grad(), row_prints(model, rows=size) as calls:
            model(x[i * size:(i + 1) * size])
        pieces.append((i * size, calls))
    return first_mixing(whole, pieces)


@pytest.mark.parametrize("parts", [2, 4])
def test_the_probe_names_the_module_or_the_forward_that_mixes_samples_and_nothing_else(parts):
    import torch

    models, x = _models(), torch.randn(16, 8)
    found = _probe(models["module"], x, parts)
    assert found is not None and (found.module, found.kind, found.cls) == ("stddev", "output", "Std")
    assert found.moved >= found.rows / 2 and found.worst > 10 * found.tolerance
    assert found.where() == "the outputs of module 'stddev' (Std)"
    # Computed in the model's own forward between two modules: the next module's inputs moved.
    found = _probe(models["forward"], x, parts)
    assert found is not None and (found.module, found.kind, found.caller, found.caller_cls) == (
        "head", "input", "", "InForward")
    assert found.where() == "the inputs of module 'head' (Linear), computed in the model's own forward (InForward),"
    assert "B/2 samples, one process over B, so the 2-rank step cannot equal" in found.cause(world_size=2)
    # A per-sample model differs by rounding only at another batch size; a BatchNorm's own
    # statistics are grouped by ``normalisation`` and judged by ``batch_layout``, not here.
    assert _probe(models["per-sample"], x, parts) is None
    assert _probe(models["batchnorm"], x, parts) is None


def test_a_mixing_model_is_not_a_loss_that_is_not_a_mean_and_its_twin_is_no_floor():
    import torch

    model, x = _models()["module"], torch.randn(8, 8)
    split = loss_split(model, lambda m, a, b: torch.nn.functional.softplus(m(a)).mean(), (x, x),
                       [(x[:4], x[:4]), (x[4:], x[4:])])
    assert split["mixing"]["module"] == "stddev" and split["grad_gap"] > split["threshold"]
    assert split_weighting(split) is None  # the loss is a mean: the model's outputs moved
    per_sample = _models()["per-sample"]
    plain = loss_split(per_sample, lambda m, a, b: m(a).mean(), (x, x), [(x[:4], x[:4]), (x[4:], x[4:])])
    assert "mixing" not in plain
    # The twin computes the statistic over the ranks' samples: beyond the fixed tolerances its
    # difference is the mixing, no floor; within them, a floor as any other.
    ref, twin = _runs([_c("w", 0.05, 1.0)], loss_split=split)
    floor = twin_floor(ref, twin, twin_microbatches=2)
    assert not floor.measured and floor.mixing == split["mixing"] and not floor.weighting
    assert floor.twin_by_name == {"w": (1.0, 1.0)}
    assert floor.reason.startswith("the outputs of module 'stddev' (Std) for a sample depend on the other "
                                   "samples of its batch, and the run on 2 microbatches differs"), floor.reason
    assert floor.to_json()["mixing"]["module"] == "stddev"
    ref, twin = _runs([_c("w", 1e-7, 1.0)], loss_split=split)
    assert twin_floor(ref, twin, twin_microbatches=2).measured


def test_the_batch_dimension_is_the_one_the_parts_were_cut_along():
    import torch
    from torch import nn

    class SeqFirst(nn.Module):  # (time, batch, features): batch_dim 1, as a seq-first RNN's target
        def __init__(self) -> None:
            super().__init__()
            self.features, self.head = nn.Linear(4, 8), nn.Linear(9, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.features(x)
            std = h.std(1, keepdim=True).mean(2, keepdim=True).expand(-1, h.shape[1], 1)
            return self.head(torch.cat([h, std], 2))

    torch.manual_seed(0)
    model, x = SeqFirst(), torch.randn(5, 8, 4)
    split = loss_split(model, lambda m, a, b: m(a).mean(), (x, x), [(x[:, :4], x[:, :4]), (x[:, 4:], x[:, 4:])])
    assert (split["mixing"]["module"], split["mixing"]["kind"], split["mixing"]["rows"]) == ("head", "input", 8)
    assert split_weighting(split) is None


def _record(session, check_id, target):  # type: ignore[no-untyped-def]
    from conformance.harness.registry import BY_ID

    record, _ = session.run_check(BY_ID[check_id], target_spec(target))
    return record


@pytest.mark.parametrize("check", ["gradient-equivalence", "no-sync-equivalence", "shared-weights"])
def test_a_minibatch_std_layer_is_inconclusive_naming_the_module(suite_session, check):
    record = _record(suite_session, check, "minibatch_std")
    assert record.status == "inconclusive", record.message
    assert ("the outputs of module 'stddev' (MinibatchStd) for a sample depend on the other samples of "
            "its batch" in record.message), record.message
    assert "so the 2-rank step cannot equal the large-batch step by design" in record.message
    for wrong in ("not a mean", "no known cause", "gets a gradient", "normalised per rank"):
        assert wrong not in record.message, record.message
    assert "fixed groups of contiguous samples" in (record.recommendation or "")
    assert record.evidence["mixing"]["module"] == "stddev"
    if check != "shared-weights":
        assert "times 1 (" in record.message and "no scaling by N or K on top" in record.message


def test_a_loss_times_the_world_size_on_top_of_a_minibatch_std_is_still_named(suite_session):
    record = _record(suite_session, "gradient-equivalence", "minibatch_std_times_world")
    assert record.status == "failed", record.message
    assert "the loss is multiplied by the world size (factor 2 = N)" in record.message
    assert "on the same 2 microbatches (the floor's twin" in record.message
    assert "module 'stddev' (MinibatchStd)" in record.message
    assert "Remove the multiplication by the world size" in (record.recommendation or "")


def test_no_sync_forgotten_on_a_minibatch_std_model_still_fails_on_its_rounds(suite_session):
    record = _record(suite_session, "no-sync-equivalence", "minibatch_std_no_sync_forgotten")
    assert record.status == "failed", record.message
    assert record.message.startswith("4 all-reduce rounds per optimizer step for K=4 microbatches instead of 1 "
                                     "(judged without the gradients, which a model that mixes samples kept "
                                     "from being compared"), record.message
    assert "module 'stddev' (MinibatchStd)" in record.message


@pytest.mark.parametrize("check", ["gradient-equivalence", "no-sync-equivalence", "shared-weights"])
def test_the_advised_variant_with_fixed_contiguous_groups_passes(suite_session, check):
    # The statistic still mixes samples, within groups both sides form alike: nothing is named.
    record = _record(suite_session, check, "minibatch_std_fixed_groups")
    assert record.status == "passed", record.message


def test_two_optimizer_steps_in_a_call_are_one_round_each_on_a_minibatch_std_model(suite_session):
    # StyleGAN's lazy regularisation: a second synchronised backward with an optimizer step of its own.
    record = _record(suite_session, "no-sync-equivalence", "minibatch_std_lazy_regularisation")
    assert record.status == "inconclusive", record.message
    assert "module 'stddev' (MinibatchStd)" in record.message and "rounds" not in record.message, record.message
