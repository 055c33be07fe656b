"""The rank-side instruments on a plain model, in this process: the step pre-hook sees the
gradients the optimizer consumed even when zero_grad(set_to_none=True) follows the step; the
clip probe sees the norm and the gradients before clipping and leaves torch as it found it;
dropout is switched off and randomness left in forward is detected."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import utils

from conformance.checks.equivalence.instruments import ClipProbe, StepRecorder, first_nonfinite
from conformance.checks.equivalence.randomness import disable_dropout, forward_is_random


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(3, 4), nn.Dropout(0.5), nn.Linear(4, 2))


def test_step_recorder_sees_gradients_wiped_after_the_step():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    recorder = StepRecorder.attach(model, opt)
    model(torch.ones(2, 3)).sum().backward()
    expected = model[0].weight.grad.clone()
    opt.step()
    opt.zero_grad(set_to_none=True)  # nanoGPT's order: nothing left in .grad
    assert model[0].weight.grad is None
    assert recorder.steps == 1 and torch.equal(recorder.grads["0.weight"], expected)
    recorder.close()


def test_clip_probe_records_before_clipping_and_restores_torch():
    model = _model()
    original = utils.clip_grad_norm_
    namespace = {"clip_grad_norm_": original}
    probe = ClipProbe.attach(model, [namespace])
    (model(torch.ones(2, 3)).sum() * 100).backward()
    before = model[2].weight.grad.clone()
    namespace["clip_grad_norm_"](model.parameters(), 0.01)  # as `from torch.nn.utils import ...`
    assert torch.equal(probe.pre_clip["2.weight"], before)
    assert probe.engaged() and probe.calls[0]["max_norm"] == 0.01
    probe.close()
    assert utils.clip_grad_norm_ is original and namespace["clip_grad_norm_"] is original


def test_dropout_switched_off_and_randomness_detected():
    model = _model()
    run = lambda m: m(torch.ones(8, 3))
    assert forward_is_random(model, run)
    assert disable_dropout(model) == ["1"]
    assert not forward_is_random(model, run)


def test_first_nonfinite_names_the_tensor():
    assert first_nonfinite([("a", torch.ones(2)), ("b", torch.tensor([1.0, float("nan")]))]) == "b"
    assert first_nonfinite([("a", torch.ones(2)), ("c", None)]) is None


def test_the_randomness_probe_moves_no_state_of_the_real_run():
    # BatchNorm in training mode updates its running statistics in every forward: the probe
    # puts them back, leaves the parameters and the global generator where they were.
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    batch = torch.randn(8, 3, generator=torch.Generator().manual_seed(0))
    assert not forward_is_random(model, lambda m: m(batch))
    assert torch.equal(torch.rand(3), expected)
    moved = [k for k, v in model.state_dict().items() if not torch.equal(v, before[k])]
    assert moved == []
