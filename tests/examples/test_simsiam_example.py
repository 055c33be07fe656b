"""examples/train_simsiam.py: a siamese trainer with BatchNorm whose views share one forward.
Every BatchNorm receives two rows per sample (views concatenated, or a pair packed per sample),
and the equivalence checks group the reference's BatchNorm by the samples each call holds, as
observed on the model: the correct layouts pass (before, a pair packed per sample failed "no
known cause", and one sample per microbatch crashed the suite's grouping: "Expected more than 1
value per channel"); a loss multiplied by the world size still fails with the factor named."""

from __future__ import annotations

import pytest

from conformance.harness.registry import BY_ID

from ._variants import EXAMPLES, variant

EXAMPLE = str(EXAMPLES / "train_simsiam.py")
ONE_FORWARD = ("        z = self.projector(self.encoder(torch.cat([view1, view2])))\n"
               "        p = self.predictor(z)\n"
               "        z1, z2 = z.chunk(2)\n"
               "        p1, p2 = p.chunk(2)\n")
PER_VIEW = ("        z1, z2 = (self.projector(self.encoder(v)) for v in (view1, view2))\n"
            "        p1, p2 = self.predictor(z1), self.predictor(z2)\n")
PACKED = ("        z = self.projector(self.encoder(torch.stack([view1, view2], 1).flatten(0, 1)))\n"
          "        p = self.predictor(z)\n"
          "        z1, z2 = z.unflatten(0, (-1, 2)).unbind(1)\n"
          "        p1, p2 = p.unflatten(0, (-1, 2)).unbind(1)\n")


def _record(session, check, target):  # type: ignore[no-untyped-def]
    record, _ = session.run_check(BY_ID[check], target)
    return record


@pytest.mark.parametrize("check_id", ["gradient-equivalence", "no-sync-equivalence"])
def test_views_concatenated_into_one_forward_pass(suite_session, check_id):
    # no-sync-equivalence: K=4 microbatches of one sample per rank, two rows in each BatchNorm.
    record = _record(suite_session, check_id, EXAMPLE)
    assert record.status == "passed", record.message
    layouts = record.evidence["batchnorm_layouts"]
    assert layouts["reference"]["encoder.0.1"] == {"rows_per_sample": 2, "arrangement": "view-major"}
    assert layouts["ranks"]["projector.1"] == {"rows_per_sample": 2, "arrangement": "view-major"}
    assert record.evidence["batchnorm_sizes_seen"]["ranks"] == [[record.evidence["batchnorm_group"]]] * 2


@pytest.mark.parametrize("layout", ["per_view", "packed"])
def test_other_correct_layouts_pass(suite_session, tmp_path, layout):
    path = variant(tmp_path, "train_simsiam.py", layout, (ONE_FORWARD, PER_VIEW if layout == "per_view" else PACKED))
    record = _record(suite_session, "gradient-equivalence", path)
    assert record.status == "passed", record.message
    expected = ({"rows_per_sample": 1, "arrangement": "sample-major"} if layout == "per_view"
                else {"rows_per_sample": 2, "arrangement": "sample-major"})
    assert record.evidence["batchnorm_layouts"]["reference"]["projector.1"] == expected


def test_loss_times_world_still_fails_naming_the_factor(suite_session, tmp_path):
    path = variant(tmp_path, "train_simsiam.py", "loss_times_world",
                   ("        (forward_loss(model, microbatch) / k).backward()",
                    "        import torch.distributed as dist\n"
                    "        (forward_loss(model, microbatch) / k * dist.get_world_size()).backward()"))
    for check_id in ("gradient-equivalence", "no-sync-equivalence"):
        record = _record(suite_session, check_id, path)
        assert record.status == "failed", record.message
        assert record.metrics["gradient_factor"] == pytest.approx(2.0, rel=1e-3)
        assert "the loss is multiplied by the world size" in record.message
