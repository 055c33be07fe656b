"""Comparisons happen where the tensors are; only summaries reach the supervisor.

- What every rank returns per world call (pickled) stays the same size for a model 10x
  larger, for gradient-equivalence, no-sync-equivalence, rank-consistency and shared-weights:
  no tensor of the model travels (the reference's reach the ranks as files).
- The on-device, chunked comparison gives the whole-tensor numbers, names the worst element,
  and fails a tensor outside tolerance; a snapshot of a view saves only the view.
- A build_model that is not deterministic still starts both runs from the same weights (the
  reference's copied in, and said); a shared weight whose DDP gradient is half the reference's
  fails shared-weights through the ranks' summaries.
"""

from __future__ import annotations

import math
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch

from conformance.checks.equivalence import tensors as _compare
from conformance.checks.equivalence.tensors import compare_tensor
from conformance.checks.equivalence.snapshots import read_snapshot, write_snapshot
from conformance.harness.registry import BY_ID

# A reused module (``mid`` runs twice per forward): shared-weights has a subject, and the same
# file serves every check. Width 120 -> ~29 K parameters; width 380 -> ~290 K (10x).
_TARGET = '''
import torch
from torch import nn

WIDTH = {width}
global_batch_size = 16
ddp_kwargs = {{}}


class Reused(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(WIDTH, WIDTH)
        self.mid = nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        return self.mid(torch.tanh(self.mid(torch.tanh(self.inp(x)))))


def build_model():
    return Reused()


def make_batch(generator, batch_size):
    return (torch.randn(batch_size, WIDTH, generator=generator),
            torch.randn(batch_size, WIDTH, generator=generator))


def loss_fn(outputs, targets):
    return nn.functional.mse_loss(outputs, targets){extra}
'''

CHECKS = ("gradient-equivalence", "no-sync-equivalence", "rank-consistency", "shared-weights")


def _write_target(folder: Path, name: str, width: int, extra: str = "") -> str:
    path = folder / f"{name}.py"
    path.write_text(_TARGET.format(width=width, extra=extra))
    return str(path)


class _Measured:
    """A persistent world whose every call's per-rank return value is pickled and measured."""

    def __init__(self, inner: Any, sizes: list[int]) -> None:
        self._inner, self._sizes = inner, sizes

    def run(self, fn: Any, *args: Any, deadline: float | None = None, **kwargs: Any) -> Any:
        results = self._inner.run(fn, *args, deadline=deadline, **kwargs)
        self._sizes.append(max(len(pickle.dumps(r.value)) for r in results))
        return results

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def _largest_return(session: Any, monkeypatch: Any, check: str, spec: str) -> tuple[int, int]:
    """(largest per-rank return of any call, number of calls) of one check on ``spec``."""
    sizes: list[int] = []
    world = session.world
    monkeypatch.setattr(session, "world", lambda backend=None, world_size=None:
                        _Measured(world(backend, world_size), sizes))
    try:
        record, _ = session.run_check(BY_ID[check], spec)
    finally:
        monkeypatch.setattr(session, "world", world)
    assert record.status == "passed", (check, record.message)
    return max(sizes), len(sizes)


@pytest.mark.parametrize("check", CHECKS)
def test_the_supervisor_receives_summaries_not_tensors(suite_session, monkeypatch, tmp_path, check):
    small = _write_target(tmp_path, "small", 120)
    large = _write_target(tmp_path, "large", 380)
    model_bytes = 4 * (2 * 380 * 380 + 2 * 380)  # fp32 parameters of the large model: 1.16 MB
    small_bytes, small_calls = _largest_return(suite_session, monkeypatch, check, small)
    large_bytes, large_calls = _largest_return(suite_session, monkeypatch, check, large)
    assert small_calls == large_calls >= 1
    # Independent of the model size: the same summaries (a few floats per tensor) for 10x the
    # parameters. Shipping even one gradient of one layer (578 KB) would break both bounds.
    assert large_bytes <= small_bytes * 1.05 + 512, (small_bytes, large_bytes)
    assert large_bytes < model_bytes / 20, (large_bytes, model_bytes)


def test_chunked_comparison_equals_the_whole_tensor_and_names_the_worst_element(monkeypatch):
    monkeypatch.setattr(_compare, "CHUNK", 7)  # 100 elements in 15 chunks
    gen = torch.Generator().manual_seed(0)
    ref = torch.randn(10, 10, generator=gen)
    got = ref * 2.0
    got.view(-1)[63] += 50.0  # the worst element
    c = compare_tensor("w", got, ref, grad=True)
    delta = (got.double() - ref.double()).abs()
    assert c.diff.max_abs == pytest.approx(float(delta.max()))
    assert c.diff.max_rel == pytest.approx(float(delta.max() / ref.abs().max()))
    assert c.diff.ratio == pytest.approx(float((delta / (1e-6 + 1e-5 * ref.double().abs())).max()))
    assert not c.diff.ok and c.diff.worst_element is not None
    assert c.diff.worst_element[0] == 63 and c.diff.worst_element[1] == pytest.approx(float(got.view(-1)[63]))
    factor = float(got.double().flatten() @ ref.double().flatten()) / float(ref.double().pow(2).sum())
    assert c.dot / c.ref_sq == pytest.approx(factor)
    assert c.residual == pytest.approx(float((got.double() - factor * ref.double()).norm()))
    same = compare_tensor("w", ref.clone(), ref, grad=True)
    assert same.diff.ok and same.diff.ratio == 0.0
    nan = compare_tensor("w", torch.full((3,), float("nan")), torch.ones(3), grad=True)
    assert not nan.diff.ok and not nan.got_finite and math.isnan(nan.diff.ratio)
    missing = compare_tensor("w", None, torch.ones(3), grad=True)
    assert not missing.diff.ok and missing.diff.note == "gradient missing in the DDP run"


def test_a_snapshot_of_a_view_saves_the_view_alone(tmp_path):
    bucket = torch.arange(1_000_000, dtype=torch.float32)  # a DDP bucket: 4 MB
    view = bucket[10:20]
    norms = write_snapshot(tmp_path, "grads", [("a", view), ("b", None)])
    assert norms["a"] == pytest.approx(float(view.double().norm())) and norms["b"] is None
    assert sum(f.stat().st_size for f in (tmp_path / "grads").iterdir()) < 10_000
    read = list(read_snapshot(tmp_path, "grads", torch.device("cpu")))
    assert [n for n, _ in read] == ["a", "b"] and torch.equal(read[0][1], view) and read[1][1] is None
    assert list(read_snapshot(tmp_path, "never-written", torch.device("cpu"))) == []


def test_a_non_deterministic_build_still_starts_both_runs_alike(suite_session, tmp_path):
    # build_model draws from an unseeded generator: every process builds other weights.
    extra = ("\n\n_unseeded = torch.Generator().manual_seed(__import__('os').getpid())\n\n\n"
             "def build_model():\n    model = Reused()\n    with torch.no_grad():\n"
             "        model.inp.weight.copy_(torch.randn(model.inp.weight.shape, generator=_unseeded))\n"
             "    return model\n")
    spec = _write_target(tmp_path, "unseeded", 32, extra)
    record, _ = suite_session.run_check(BY_ID["gradient-equivalence"], spec)
    assert record.status == "passed", record.message
    assert record.evidence["initial_differs_from_reference"] == "inp.weight"
    assert record.metrics["max_abs_param_diff"] < 1e-6


def test_a_halved_shared_gradient_fails_through_the_summaries(suite_session, tmp_path):
    # A summed loss: each rank's gradient is its shard's sum, DDP averages them -> 1/N of the
    # reference's gradient of the global batch, for the reused module as for every other.
    spec = _write_target(tmp_path, "summed", 32,
                         "\n\n\ndef loss_fn(outputs, targets):\n"
                         "    return nn.functional.mse_loss(outputs, targets, reduction='sum')\n")
    record, _ = suite_session.run_check(BY_ID["shared-weights"], spec)
    assert record.status == "failed"
    # Named by its cause: an unshared parameter is off by the same factor.
    assert "every gradient is 0.5x the single-process one under DDP configured, shared or not" in record.message
    assert "the loss is a sum over samples" in record.message
    row = record.evidence["variants"][0]
    assert row["param"].startswith("mid.") and row["ratio_to_tolerance"] > 1
    assert "worst_element" in row


def test_sparse_gradients_compare_as_the_dense_tensors_they_stand_for():
    def sparse(values, rows):  # EmbeddingBag(sparse=True): one sparse dim, uncoalesced
        return torch.sparse_coo_tensor(torch.tensor([rows]), values, (1000, 4))

    values = torch.randn(3, 4, dtype=torch.float64).float()
    got, ref = sparse(values, [7, 2, 7]), sparse(values[[2, 1, 0]], [7, 2, 7])  # the same sum, reordered
    dense = compare_tensor("emb", got.to_dense(), ref.to_dense(), grad=True)
    same = compare_tensor("emb", got, ref, grad=True)
    assert same.diff.ok and same.diff.max_abs == dense.diff.max_abs
    assert same.ref_sq == pytest.approx(dense.ref_sq) and same.dot == pytest.approx(dense.dot)
    doubled = compare_tensor("emb", sparse(values * 2, [7, 2, 7]), ref, grad=True)
    assert not doubled.diff.ok and doubled.dot / doubled.ref_sq == pytest.approx(2.0, rel=1e-6)
    # A row only one side touched, reported where it is in the table (row 900; column 3 below).
    extra = compare_tensor("emb", sparse(torch.cat([values, torch.ones(1, 4)]), [7, 2, 7, 900]), ref, grad=True)
    assert not extra.diff.ok and extra.diff.worst_element[0] // 4 == 900
    worst = compare_tensor("emb", sparse(torch.tensor([[0.0, 0.0, 0.0, 5.0]]), [900]), sparse(torch.zeros(1, 4), [3]),
                           grad=False)
    assert worst.diff.worst_element == (900 * 4 + 3, 5.0, 0.0)
