"""The gloo stand-in for nn.SyncBatchNorm (``conformance.harness.sync_batchnorm``) computes
BatchNorm's maths: in one process (no group: its all-reduce is the identity) it matches plain
BatchNorm in outputs, gradients and running statistics, and it is put only where a CPU would
refuse the real one. Across ranks it is exercised by examples/train_contrastive.py
(tests/examples/test_contrastive_example.py)."""

from __future__ import annotations

import copy

import torch
from torch import nn

from conformance.harness.sync_batchnorm import substitute, substituted


def test_one_process_matches_batchnorm_in_outputs_gradients_and_running_statistics():
    torch.manual_seed(0)
    plain = nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3, momentum=0.3))
    synced = nn.SyncBatchNorm.convert_sync_batchnorm(copy.deepcopy(plain))
    assert substitute(synced, torch.device("cpu")) == ["1"]
    x, w = torch.randn(5, 2, 6, 6), torch.randn(5, 3, 4, 4)
    for model in (plain, synced):
        (model(x) * w).sum().backward()  # not the sum of squares: BatchNorm makes that constant
    torch.testing.assert_close(synced(x), plain(x), rtol=1e-5, atol=1e-5)
    for (name, p), q in zip(plain.named_parameters(), synced.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=name)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(synced[1], name), getattr(plain[1], name), rtol=1e-5, atol=1e-6)
    synced.eval(), plain.eval()
    torch.testing.assert_close(synced(x), plain(x), rtol=1e-5, atol=1e-5)


def test_the_real_one_is_kept_off_a_cpu():
    model = nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(nn.BatchNorm1d(4)))
    assert substitute(model, torch.device("meta")) == []
    assert isinstance(model[0], nn.SyncBatchNorm) and substituted(model) == []
