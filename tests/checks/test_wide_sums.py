"""The float64 sums and norms the recorded run takes of every parameter and gradient
(``conformance/checks/equivalence/wide_sums.py``): the same values as the whole-tensor float64
reductions, without widening the whole tensor; the reference's gradient norms measured once.

- ``sum64`` / ``norm64`` agree with ``sum(dtype=float64)`` / ``vector_norm(dtype=float64)`` to
  1e-12 across chunks and dtypes, propagate NaN/Inf, and take a strided view whole;
- the gradient norms (``adaptive.gradient_norms``) and rank-consistency's digests allocate a
  chunk, not a float64 copy of the tensor (before: twice the tensor's bytes, the largest cost
  of a rank's recorded run at 34 M parameters after the training itself);
- ``first_nonfinite_of_norms`` names what ``first_nonfinite`` names, searching only tensors
  whose norm is not finite;
- the reference's snapshot keeps the gradient norms it was given instead of measuring them again.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from conformance.checks.equivalence import snapshots as _snapshots
from conformance.checks.equivalence.adaptive import gradient_norms
from conformance.checks.equivalence.instruments import first_nonfinite, first_nonfinite_of_norms
from conformance.checks.equivalence.snapshots import SnapshotWriter
from conformance.checks.equivalence.wide_sums import CPU_CHUNK as CHUNK
from conformance.checks.equivalence.wide_sums import norm64, sum64

SIZE = 3 * CHUNK + 17  # several chunks and a ragged last one


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_the_same_float64_sums_and_norms_as_the_whole_tensor_reductions(dtype):
    t = torch.randn(SIZE, generator=torch.Generator().manual_seed(0)).add_(0.3).to(dtype)
    assert sum64(t) == pytest.approx(float(t.sum(dtype=torch.float64)), rel=1e-12)
    assert norm64(t) == pytest.approx(float(torch.linalg.vector_norm(t, dtype=torch.float64)), rel=1e-12)
    # A view with strides, a parameter and a tensor of one chunk or less: the same numbers.
    m = t[: SIZE - 17].reshape(-1, 64).t()
    assert sum64(m) == pytest.approx(float(m.sum(dtype=torch.float64)), rel=1e-12)
    assert norm64(torch.nn.Parameter(t.float())) == pytest.approx(norm64(t.float()), rel=0)
    assert sum64(t[:5]) == float(t[:5].sum(dtype=torch.float64))


def test_nan_and_inf_propagate():
    t = torch.ones(SIZE)
    t[2 * CHUNK + 3] = float("inf")
    assert sum64(t) == math.inf and norm64(t) == math.inf
    t[CHUNK + 1] = float("nan")
    assert math.isnan(sum64(t)) and math.isnan(norm64(t))


def _largest_allocation(fn) -> int:
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return max((e.cpu_memory_usage for e in prof.events()), default=0)


def test_no_float64_copy_of_the_whole_tensor():
    from conformance.checks.rank_consistency import _snapshot

    grad = torch.randn(16 * CHUNK)
    nbytes = grad.numel() * grad.element_size()
    # Before: vector_norm / sum with dtype=float64 widened the whole tensor first (2 x its bytes).
    assert _largest_allocation(lambda: gradient_norms([("w", grad)])) < nbytes / 4
    assert _largest_allocation(lambda: _snapshot([("w", grad)])) < nbytes / 4
    assert _largest_allocation(lambda: sum64(grad)) < nbytes / 4


def test_first_nonfinite_from_the_norms_names_what_a_full_search_names():
    finite, nan, inf = torch.ones(4), torch.tensor([1.0, float("nan")]), torch.tensor([float("-inf"), 2.0])
    huge = torch.full((4,), 1e200, dtype=torch.float64)  # finite, but its squares overflow
    for named in ([("a", finite), ("b", None), ("c", nan), ("d", inf)], [("a", finite), ("d", inf), ("c", nan)],
                  [("h", huge), ("a", finite)], [("b", None)], []):
        norms = gradient_norms(named)
        assert first_nonfinite_of_norms(named, norms) == first_nonfinite(named)
    assert norms == {} and gradient_norms([("h", huge)])["h"] == math.inf

    class Untouchable:
        def __getattr__(self, name):
            raise AssertionError("a tensor whose norm is finite was searched again")

    assert first_nonfinite_of_norms([("a", Untouchable()), ("c", nan)], {"a": 2.0, "c": math.nan}) == "c"


def test_the_reference_keeps_the_gradient_norms_it_measured(tmp_path, monkeypatch):
    g = torch.Generator().manual_seed(1)
    dense, sparse = torch.randn(300, generator=g), torch.sparse_coo_tensor([[0, 2, 2]], [1.5, -2.0, 1.0], (4,))
    named = [("w", dense), ("s", sparse), ("none", None)]
    measured = []
    norm = _snapshots._norm
    monkeypatch.setattr(_snapshots, "_norm", lambda t: measured.append(t.layout) or norm(t))
    writer = SnapshotWriter(tmp_path)
    # Given by the gradient recorder (``recording``): its float64 norms of the same tensors.
    writer.write("grads0", named, known={"w": 12.5, "s": 99.0, "none": None})
    norms = writer.norms("grads0")
    writer.close()
    assert norms["w"] == 12.5 and norms["none"] is None
    # A sparse gradient is measured coalesced, as before (its duplicate index summed first).
    assert norms["s"] == pytest.approx(math.sqrt(1.5 ** 2 + 1.0 ** 2)) and measured == [torch.sparse_coo]


def test_sparse_tensors_sum_and_norm_their_stored_values():
    import torch

    from conformance.checks.equivalence.wide_sums import norm64, sum64

    values = torch.randn(3, 4)
    grad = torch.sparse_coo_tensor(torch.tensor([[5, 1, 5]]), values, (10, 4))  # row 5 twice
    assert sum64(grad) == pytest.approx(float(grad.to_dense().double().sum()))
    assert norm64(grad) == pytest.approx(float(grad.to_dense().double().norm()))
