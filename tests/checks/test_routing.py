"""Top-k routing compared across sides (``equivalence.routing``), without a world: each side's calls laid
out in the reference's row order (ranks, microbatches, a twin's reversed microbatches), the first
step whose decisions differ, a twin trimmed to the steps before its own flip, and what the judge
may conclude from a flip."""

from __future__ import annotations

import numpy as np
import torch

from conformance.checks.equivalence.floor import twin_floor
from conformance.checks.equivalence.routing import RoutingProbe, explains, first_flip, trim_twin


def _call(rows: np.ndarray) -> tuple[int, int, bytes]:
    rows = np.asarray(rows, dtype=np.int64)
    return rows.shape[0], rows.shape[1], rows.tobytes()


CHOICES = np.array([[0, 1], [2, 3], [1, 2], [3, 0], [0, 2], [1, 3], [2, 0], [3, 1]])


def test_the_probe_records_every_topk_call_per_step():
    with RoutingProbe.watching() as probe:
        x = torch.arange(12.0).reshape(3, 4)
        x.topk(2, dim=-1)
        torch.topk(x, 1)
        calls = probe.take()
    assert calls is not None and [(r, k) for r, k, _ in calls] == [(3, 2), (3, 1)]
    assert np.frombuffer(calls[0][2], dtype=np.int64).reshape(3, 2).tolist() == [[3, 2]] * 3
    assert probe.take() == []
    assert torch.Tensor.topk is not None and torch.topk(torch.ones(2), 1)  # restored


def test_ranks_and_microbatches_are_laid_out_in_the_reference_row_order():
    ref = {"routing": [[_call(CHOICES)]], "grads0_step": 0}
    # 2 ranks x 2 microbatches of 2 rows: rank r's forwards cover blocks 2r, 2r+1.
    ranks = [{"routing": [[_call(CHOICES[0:2]), _call(CHOICES[2:4])]]},
             {"routing": [[_call(CHOICES[4:6]), _call(CHOICES[6:8])]]}]
    assert first_flip(ref, ranks)[0] is None
    # The same choices in another order within a row are the same decision (a set).
    swapped = [{"routing": [[_call(CHOICES[0:4][:, ::-1])]]}, ranks[1]]
    assert first_flip(ref, swapped)[0] is None
    # The twin on 4 microbatches in reverse order: blocks 3, 2, 1, 0.
    twin = {"routing": [[_call(CHOICES[6:8]), _call(CHOICES[4:6]), _call(CHOICES[2:4]), _call(CHOICES[0:2])]]}
    assert first_flip(ref, [twin], blocks_reversed=4)[0] is None
    # One token on rank 1 chose another expert.
    flipped = CHOICES[4:6].copy()
    flipped[1] = [1, 0]
    flip, _ = first_flip(ref, [ranks[0], {"routing": [[_call(flipped), _call(CHOICES[6:8])]]}])
    assert flip is not None and (flip.step, flip.tokens, flip.rows) == (0, 1, 8)
    # A layout that does not map is said, not guessed.
    flip, note = first_flip(ref, [{"routing": [[_call(CHOICES[:3])]]}, ranks[1]])
    assert flip is None and "not compared" in note


def test_a_twin_that_flipped_is_a_floor_of_the_steps_before_only():
    steps = [[_call(CHOICES)], [_call(CHOICES)], [_call(CHOICES)]]
    ref = {"routing": steps, "grads0_step": 0, "optimizer_steps": [1, 1, 1], "clip_calls": [[], [], []],
           "grads0": {}, "nonfinite": None}
    other = CHOICES.copy()
    other[0] = [2, 3]
    twin = {**ref, "routing": [steps[0], [_call(other)], steps[2]], "params": [["p0"], ["p1"], ["p2"]]}
    trimmed, flip = trim_twin(ref, twin)
    assert flip is not None and flip.step == 1 and trimmed is not None and trimmed["params"] == [["p0"]]
    # Flipped at the compared gradients: no floor at all, with the reason.
    early = {**twin, "routing": [[_call(other)], steps[1], steps[2]]}
    trimmed, flip = trim_twin(ref, early)
    floor = twin_floor(ref, trimmed, twin_microbatches=2)
    assert not floor.measured and "measures a flip, not rounding" in floor.reason
    # The judge: a flip accounts for a mismatch only when what came before it matched.
    assert explains(flip, grads0_step=0, before_ok=False)  # flipped at the first step
    late = trim_twin(ref, twin)[1]
    assert explains(late, grads0_step=0, before_ok=True)
    assert not explains(late, grads0_step=0, before_ok=False)  # the gradients already differed
    assert not explains(None, grads0_step=0, before_ok=True)
