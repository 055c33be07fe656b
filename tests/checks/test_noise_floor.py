"""The measured noise floor (``equivalence.floor``) and the comm hook's compression bound
(``equivalence.compression``), judged without a world: when the twin run is a measurement of noise and when
it is not (with the reason), the floor robust to a tensor that happened to agree exactly, the
bound a difference is judged against, and the "cannot distinguish" verdict with its numbers.
The end-to-end runs (bf16 autocast, fp16/bf16/PowerSGD hooks; correct passes, scaled loss
caught) are in tests/examples/test_numerics_examples.py."""

from __future__ import annotations

import re

import pytest

from conformance.checks.equivalence.tensors import Compared, TensorDiff, tolerance_for
from conformance.checks.equivalence.compression import compression_bound
from conformance.checks.equivalence.floor import MARGIN, Floor, smallest_bug, twin_floor

TOL = tolerance_for("float32", grad=True)


def _c(name: str, rel: float, scale: float, *, factor: float = 1.0) -> Compared:
    """A twin-vs-reference summary: max |Δ| = rel·scale on a tensor whose max |ref| is scale."""
    ref_sq = (10 * scale) ** 2
    diff = TensorDiff(name, rel * scale, rel, rel * scale / (TOL.atol + TOL.rtol * scale), TOL,
                      ref_max=scale)
    return Compared(diff, True, True, ref_sq=ref_sq, dot=factor * ref_sq,
                    got_sq=factor ** 2 * ref_sq, residual=0.0)


def _runs(grads: list[Compared], **twin_overrides: object) -> tuple[dict, dict]:
    ref = {"optimizer_steps": [1, 1], "grads0_step": 0, "clip_calls": [[], []],
           "grads0": {c.name: 10 * c.diff.ref_max for c in grads}, "nonfinite": None}
    twin = {**ref, "grads0": grads, "pre_clip0": None, "params": [[_c("w", 1e-3, 0.5)]],
            **twin_overrides}
    return ref, twin


def test_floor_is_the_largest_relative_twin_difference_over_tensors_of_real_scale():
    # 'b' agreed bit for bit with the reference; 'tiny' is rounding noise on a gradient 1e-6 of
    # the largest (a conv bias before BatchNorm): neither sets the floor, 'w' does.
    ref, twin = _runs([_c("w", 3e-3, 1.0), _c("b", 0.0, 0.2), _c("tiny", 0.9, 1e-6)])
    floor = twin_floor(ref, twin, twin_microbatches=8)
    assert floor.measured and floor.grad_rel == pytest.approx(3e-3) and floor.grad_tensor == "w"
    # Parameters: the largest absolute twin difference (1e-3 of a tensor of scale 0.5).
    assert floor.param_abs == pytest.approx(5e-4) and floor.param_bound == pytest.approx(MARGIN * 5e-4)
    # ...allowed to every parameter tensor alike, whatever its own scale: relative to a
    # zero-initialised bias of scale 1e-3 that is 2.0 of it, to a weight of scale 0.5, 4e-3.
    bias, weight = floor.widen([TensorDiff("b", 1e-3, 1.0, 1e3, TOL, ref_max=1e-3),
                                TensorDiff("w", 1e-2, 2e-2, 1e3, TOL, ref_max=0.5)], grad=False)
    assert bias.ok and bias.allowed_rel == pytest.approx(2.0)
    assert not weight.ok and weight.allowed_rel == pytest.approx(4e-3)
    assert floor.grad_bound == pytest.approx(MARGIN * 3e-3)
    # The tensor that agreed exactly is still allowed the configuration's noise, not zero.
    exact_b = TensorDiff("b", 0.01 * 0.2, 0.01, 1e3, TOL, ref_max=0.2)
    widened, = floor.widen([exact_b], grad=True)
    assert not exact_b.ok and widened.ok and widened.judged_ratio == pytest.approx(0.01 / (MARGIN * 3e-3))
    # Beyond the bound it fails, whatever the floor.
    bad, = floor.widen([TensorDiff("w", 0.5, 0.5, 1e5, TOL, ref_max=1.0)], grad=True)
    assert not bad.ok and "noise floor x margin" in bad.describe_bound()


@pytest.mark.parametrize("overrides, reason", [
    ({"optimizer_steps": [2, 2]}, r"stepped the optimizer \[2, 2\] times per step on 8 microbatches but"),
    ({"grads0_step": 1}, r"first optimizer.step\(\) ran at step 1 on 8 microbatches but at 0"),
    ({"clip_calls": [[{}] * 8, [{}] * 8]}, r"clip_grad_norm_ ran \[8, 8\] times .* inside the accumulation window"),
    ({"nonfinite": {"step": 0}}, r"NaN/Inf"),
    ({"grads0": []}, r"no gradient reached the optimizer in the twin"),
])
def test_a_twin_that_computes_something_else_is_no_floor(overrides, reason):
    ref, twin = _runs([_c("w", 3e-3, 1.0)], **overrides)
    floor = twin_floor(ref, twin, twin_microbatches=8)
    assert not floor.measured and floor.grad_bound == 0.0
    assert floor.param_bound == 0.0
    assert re.search(reason, floor.reason), floor.reason


def test_a_twin_off_by_a_factor_is_a_semantic_difference_not_noise():
    # A loss not divided by the number of microbatches: the twin on N·K=8 pieces is 8x the
    # whole-batch run. A floor of 7 would let every scaling bug pass; it is refused instead.
    ref, twin = _runs([_c("w", 7.0, 1.0, factor=8.0), _c("b", 7.0, 0.5, factor=8.0)])
    floor = twin_floor(ref, twin, twin_microbatches=8)
    assert not floor.measured and floor.twin_factors == (8.0, 8.0)
    assert "times 8..8, not 1: the step's result depends on how the batch is split" in floor.reason
    assert floor.indistinguishable(world_size=2, microbatches=4) is None


def test_a_floor_too_wide_for_the_smallest_bug_cannot_distinguish_it():
    assert smallest_bug(world_size=2, microbatches=1) == (0.5, "a loss divided by the world size or summed (factor 1/2)")
    assert smallest_bug(world_size=4, microbatches=2)[0] == 0.5  # factor 1/K = 1/2
    narrow = Floor(0.1, 0.1, 2)  # bound 0.4 < 0.5: a factor 1/2 still shows
    assert narrow.indistinguishable(world_size=2, microbatches=1) is None
    wide = Floor(0.2, 0.1, 2, grad_tensor="w")  # bound 0.8 >= 0.5
    message = wide.indistinguishable(world_size=2, microbatches=1) or ""
    assert re.search(r"cannot distinguish a loss divided by the world size or summed \(factor 1/2\) "
                     r"\(gradients off by 0.5 of their scale\) .* already differ by 0.2 of the "
                     r"scale of 'w', and the bound \(margin 4 x floor\) is 0.8", message), message
    assert "from its own rounding" in message
    # A forward that draws random numbers: the floor measured the draws, and the message says so
    # (guided-diffusion's noised classifier read "from its own rounding").
    drawn = wide.indistinguishable(world_size=2, microbatches=1, random=True) or ""
    assert "from the random numbers its forward draws" in drawn and "rounding" not in drawn


def test_compression_bounds_per_hook():
    fp16 = compression_bound({"name": "fp16_compress_hook", "kind": "fp16"}, world_size=2, steps=3)
    bf16 = compression_bound({"name": "bf16_gloo_hook", "kind": "bf16"}, world_size=2, steps=3)
    assert fp16[0] == pytest.approx(4 * 2 ** -10) and not fp16[2]
    assert bf16[0] == pytest.approx(4 * 2 ** -7) and bf16[0] < smallest_bug(world_size=2, microbatches=1)[0] / 10
    warm = compression_bound({"name": "powerSGD_hook", "kind": "powersgd", "start_powerSGD_iter": 10},
                             world_size=2, steps=3)
    assert warm[0] == 0.0 and not warm[2] and "compression not exercised" in warm[1]
    low_rank = compression_bound({"name": "powerSGD_hook", "kind": "powersgd", "start_powerSGD_iter": 2,
                                  "matrix_approximation_rank": 1}, world_size=2, steps=3)
    assert low_rank[2] and "low-rank approximation" in low_rank[1]
    # A hook the suite does not know gets no allowance: one that loses gradients fails.
    assert compression_bound({"name": "my_hook", "kind": "other"}, world_size=2, steps=3)[0] == 0.0
    assert compression_bound(None, world_size=2, steps=3) == (0.0, "no comm hook", False)


def _equivalence(floor: Floor, grad_rel: float):  # type: ignore[no-untyped-def]
    """An Equivalence as run_equivalence builds it, from summaries (no world needed)."""
    from conformance.checks.equivalence import Equivalence
    from conformance.checks.equivalence.hypotheses import Scale
    from conformance.checks.equivalence.recording import RunPlan

    grad = floor.widen([TensorDiff("w", grad_rel, grad_rel, grad_rel / TOL.rtol, TOL, ref_max=1.0)],
                       grad=True)
    rank = {"rank": 0, "optimizer_steps": [1], "grads0_step": 0, "ddp_forwards": [1],
            "inner_forwards": [1], "allreduce_rounds": [1], "batch_digests": ["a"]}
    return Equivalence(RunPlan(target_spec="mlp", global_batch=8, steps=1), grad, {"w": 0}, [], [],
                       [[]], [rank, {**rank, "rank": 1}], {"optimizer_steps": [1], "grads0_step": 0},
                       Scale(2, 1.0, 1.0, 0.1), None, floor=floor)


def test_the_judge_says_inconclusive_when_the_bound_would_admit_a_scaling_bug():
    from conformance.checks.equivalence import judge

    wide = Floor(0.2, 0.01, 2, grad_tensor="w")  # bound 0.8 >= 0.5 (factor 1/2 on 2 ranks)
    within = judge(_equivalence(wide, 0.1), what="the DDP step", recommendation="r")
    assert within is not None and within.status == "inconclusive"
    assert re.search(r"^the DDP step cannot be judged: this configuration cannot distinguish a loss "
                     r"divided by the world size", within.message), within.message
    assert within.evidence["noise_floor"]["distinguishes_smallest_bug"] is False
    assert within.evidence["noise_floor"]["gradients"]["observed_rel"] == 0.1
    # Beyond even the wide bound: a failure, not "cannot judge".
    beyond = judge(_equivalence(wide, 0.9), what="the DDP step", recommendation="r")
    assert beyond is not None and beyond.status == "failed"
    # A narrow floor: within it is a pass (None: the caller passes it).
    assert judge(_equivalence(Floor(3e-3, 1e-3, 2, grad_tensor="w"), 1e-2), what="x", recommendation="r") is None


def test_no_twin_runs_when_every_tensor_is_within_the_fixed_tolerances(suite_session):
    from ._check_helpers import run_check

    # fp32, correct: nothing a floor could widen, so no twin run (one single-process run less).
    record = run_check(suite_session, "no-sync-equivalence", "at_most_four_microbatches")
    assert record.status == "passed", record.message
    floor = record.evidence["noise_floor"]
    assert not floor["measured"] and floor["reason"].startswith("not needed: every tensor matched")


def test_a_step_that_refuses_the_twins_split_is_judged_by_the_fixed_tolerances(suite_session, monkeypatch):
    from conformance.checks.equivalence import experiment

    from ._check_helpers import run_check

    # As if a difference had exceeded the fixed tolerance: the twin must run, and cannot.
    monkeypatch.setattr(experiment, "_within_fixed_tolerances", lambda values: False)
    record = run_check(suite_session, "no-sync-equivalence", "at_most_four_microbatches")
    assert record.status == "passed", record.message
    floor = record.evidence["noise_floor"]
    assert not floor["measured"] and record.metrics["noise_floor_grad_rel"] is None
    assert re.search(r"the same train_step on 8 microbatches in one process raised \(.*ValueError.*"
                     r"8 microbatches: at most 4 fit at .*at_most_four_microbatches.py:\d+\): the step "
                     r"does not take that split",
                     floor["reason"]), floor["reason"]


def test_the_twin_is_needed_exactly_when_a_difference_exceeds_a_fixed_tolerance():
    from conformance.checks.equivalence.digests import DIGEST
    from conformance.checks.equivalence.experiment import _within_fixed_tolerances

    ok, off = _c("w", 1e-7, 1.0), _c("w", 1e-3, 1.0)  # ratio ~0.01 and ~91 of the fp32 tolerance
    nan = Compared(TensorDiff("w", float("nan"), float("nan"), float("nan"), TOL), True, True)
    rank = {"grads0": [ok], "pre_clip0": None, "params": [[ok], [ok]]}
    assert _within_fixed_tolerances([rank, rank])
    assert not _within_fixed_tolerances([rank, {**rank, "params": [[ok], [off]]}])  # any step
    assert not _within_fixed_tolerances([{**rank, "pre_clip0": [off]}])  # before clipping too
    assert not _within_fixed_tolerances([{**rank, "grads0": [nan]}])  # NaN is never within
    # A rank judged by digest compared nothing itself; no rank compared: nothing is known.
    assert _within_fixed_tolerances([rank, {"compared_by": DIGEST}])
    assert not _within_fixed_tolerances([{"compared_by": DIGEST}])
    # No twin ran: the floor says why, and widens nothing.
    floor = twin_floor(_runs([ok])[0], None, twin_microbatches=2)
    assert not floor.measured and floor.reason.startswith("not needed") and floor.grad_bound == 0


def test_a_twin_bit_identical_to_the_reference_is_run_again_in_reverse_order():
    from conformance.checks.equivalence.twin import bit_identical

    exact, off = _c("w", 0.0, 1.0), _c("w", 1e-7, 1.0)
    assert bit_identical({"grads0": [exact], "params": [[exact], [exact]]})
    assert not bit_identical({"grads0": [exact], "params": [[exact], [off]]})  # any step
    assert not bit_identical({"grads0": [exact], "pre_clip0": [off], "params": [[exact]]})
    assert not bit_identical({"grads0": [], "params": []})  # nothing compared: nothing known
    # The floor of the reordered twin says where it came from.
    ref, twin = _runs([_c("w", 3e-7, 1.0)], reordered=True)
    floor = twin_floor(ref, twin, twin_microbatches=2)
    assert floor.measured and floor.reordered and floor.to_json()["reordered"]
    assert "in reverse order (in rank order it was bit-identical" in floor.to_json()["method"]


def test_a_step_that_joins_its_microbatches_is_judged_against_a_reordered_twin(suite_session):
    from ._check_helpers import run_check

    # Transformer LM + AdamW, microbatches joined with torch.cat: AdamW turns last-bit gradient
    # differences into parameter differences of ~3.5e-5 after one step (over the fixed 1e-5),
    # and the twin in rank order is bit-identical to the reference (floor 0). Before the
    # reordered twin: failed, "parameters diverge from step 0 ... no known cause matched".
    record = run_check(suite_session, "gradient-equivalence", "joined_adamw_lm")
    assert record.status == "passed", record.message
    floor = record.evidence["noise_floor"]
    assert floor["measured"] and floor["reordered"], floor
    assert 0 < floor["parameters"]["floor_abs"] < 1e-3  # rounding amplified, far below lr = 6e-4·N
    assert record.metrics["max_abs_param_diff"] > 1e-5  # beyond the fixed tolerance: the floor decided
    # A loss multiplied by the world size still fails, named: the floor does not hide it.
    broken = run_check(suite_session, "gradient-equivalence", "joined_adamw_lm_times_world")
    assert broken.status == "failed"
    assert broken.metrics["gradient_factor"] == pytest.approx(2.0, rel=1e-3)
    assert "the loss is multiplied by the world size" in broken.message


def test_a_twin_that_ran_out_of_time_leaves_a_rounding_sized_difference_inconclusive():
    """NVlabs/edm's accumulation (K=4, a UNet) on a loaded 2-core host: the twin did not finish
    within the 60 s deadline, and the fixed tolerances alone failed a last-bit difference
    (1.2e-6 on an element of 6.7e-3, a tensor of scale 8.6: 1.4e-7 of it) as "no known cause
    matched"; with the twin measured the same run passed (0.25x the bound)."""
    from conformance.checks.equivalence import judge

    ref, twin = _runs([_c("w", 3e-7, 1.0)])
    hung = {"failed": "the call did not finish within the deadline (60 s) while rank(s) [0] ran", "timed_out": True}
    floor = twin_floor(ref, hung, twin_microbatches=8)
    assert not floor.measured and floor.timed_out and floor.to_json()["timed_out"]
    assert floor.reason.startswith("the same train_step on 8 microbatches in one process did not finish "
                                   "within the deadline"), floor.reason
    small = judge(_equivalence(floor, 2e-5), what="accumulating K=4 microbatches", recommendation="r")
    assert small is not None and small.status == "inconclusive", small
    assert small.message.startswith("accumulating K=4 microbatches cannot be judged: the noise floor was not "
                                    "measured (its single-process run did not finish within the deadline)")
    assert "--deadline" in (small.recommendation or "")
    # A step that refused the split (it raised): the fixed tolerances judge alone, as before.
    refused = twin_floor(ref, {"failed": "ValueError: 8 microbatches"}, twin_microbatches=8)
    assert not refused.timed_out
    assert judge(_equivalence(refused, 2e-5), what="x", recommendation="r").status == "failed"
    # Off by the smallest scaling bug or more: no floor could admit it, failed without one.
    assert judge(_equivalence(floor, 0.9), what="x", recommendation="r").status == "failed"


def test_the_twin_run_past_its_deadline_is_recorded_as_timed_out(monkeypatch):
    from conformance.checks.equivalence import twin as twin_module
    from conformance.harness.world import WorldHang

    class _World:
        def run(self, *args, **kwargs):
            raise WorldHang("the call did not finish within the deadline (60 s)", results=[], stuck_ranks=[0])

    class _Ctx:
        deadline = 60.0

        def world(self, world_size):
            return _World()

    out = twin_module._run_twin(_Ctx(), None)  # type: ignore[arg-type]
    assert out["timed_out"] is True and "did not finish within the deadline" in out["failed"]


def test_the_rounds_are_judged_when_the_floor_ran_out_of_time(monkeypatch):
    """EDM's step with ddp_sync(.., True) on every round (planted): numerically the same step,
    4 all-reduce rounds per optimizer step. With the twin out of time the gradients are
    undecided, but the rounds do not depend on the floor: failed on them, saying so."""
    from types import SimpleNamespace

    from conformance.checks import no_sync_equivalence

    ref, _ = _runs([_c("w", 3e-7, 1.0)])
    floor = twin_floor(ref, {"failed": "did not finish within the deadline", "timed_out": True}, twin_microbatches=8)
    eq = _equivalence(floor, 2e-5)
    for rank in eq.ranks:
        rank.update(allreduce_rounds=[4], allreduce_calls=[4], inner_forwards=[4], buckets_per_step=[1])
    monkeypatch.setattr(no_sync_equivalence, "run_equivalence", lambda ctx, **kw: eq)
    monkeypatch.setattr(no_sync_equivalence, "microbatches_for", lambda ctx: 4)
    outcome = no_sync_equivalence.run(SimpleNamespace(world_size=2))  # type: ignore[arg-type]
    assert outcome.status == "failed", outcome.message
    assert outcome.message.startswith("4 all-reduce rounds per optimizer step for K=4 microbatches instead of 1 "
                                      "(judged without the gradients, which a noise floor not measured in time "
                                      "kept from being compared: accumulating K=4 microbatches cannot be judged")
    assert "model.no_sync()" in (outcome.recommendation or "")
    assert "make_batch" not in (outcome.recommendation or "")  # no randomness to move
