"""examples/train_contrastive.py: collectives inside the step (a gather layer, SyncBatchNorm on
gloo through the suite's CPU implementation, an all-reduced statistic and count). The correct
trainer passes; each bug variant fails gradient-equivalence with its cause named from the
recorded collectives and the measured gradient factors, and one leading fix."""

from __future__ import annotations

import re

import pytest

from conformance.harness.registry import BY_ID

from ._variants import EXAMPLES, variant

EXAMPLE = "train_contrastive.py"

#: case -> (edits, regex the message must match: the real cause, and its one fix)
CASES = {
    "non_differentiable_all_reduce": (
        [("        total = dist_nn.all_reduce(total)\n", "        dist.all_reduce(total)  # BUG\n")],
        r"all_reduce \[16\] in the loss .* is not differentiable.*use `torch\.distributed\.nn\.functional\.all_reduce`"),
    "gather_without_gradient": (
        [("    return GatherLayer.apply(x) if _world()[1] > 1 else x\n",
          "    if _world()[1] == 1:\n        return x\n"
          "    out = [torch.zeros_like(x) for _ in range(dist.get_world_size())]\n"
          "    dist.all_gather(out, x)  # BUG: no gradient through the gathered features\n"
          "    return torch.cat(out)\n")],
        r"all_gather \[4, 16\] in the loss .* not differentiable.*this rank's own slot is not re-inserted"
        r".*torch\.distributed\.nn\.functional\.all_gather"),
    # open_clip's gather_features without gather_with_grad: this rank's slot put back.
    "gather_without_gradient_own_slot_reinserted": (
        [("    return GatherLayer.apply(x) if _world()[1] > 1 else x\n",
          "    if _world()[1] == 1:\n        return x\n"
          "    out = [torch.zeros_like(x) for _ in range(dist.get_world_size())]\n"
          "    dist.all_gather(out, x)  # BUG: no gradient through the other ranks' features\n"
          "    out[dist.get_rank()] = x\n"
          "    return torch.cat(out)\n")],
        r"all_gather \[4, 16\] in the loss .* not differentiable: only this rank's own slot, re-inserted"
        r".*torch\.distributed\.nn\.functional\.all_gather` \(open_clip: gather_with_grad=True\)"),
    "gather_layer_without_gradient_all_reduce": (
        [("        dist.all_reduce(grad)  # the gradient every rank's loss sent to each rank's rows\n", "")],
        r"GatherLayer's backward issues no collective.*factors between 1/2 and 1"),
    "labels_not_offset": (
        [("    labels = torch.arange(b) + rank * b  # this rank's positives in the gathered columns\n",
          "    labels = torch.arange(b)  # BUG: not offset by rank\n")],
        r"labels are not offset by rank: on rank 1 .* targets 0\.\.3 .* columns 4\.\.7"),
    "negatives_not_gathered": (
        [("    return GatherLayer.apply(x) if _world()[1] > 1 else x\n", "    return x  # BUG: this rank's negatives only\n"),
         ("    labels = torch.arange(b) + rank * b  # this rank's positives in the gathered columns\n",
          "    labels = torch.arange(b)\n")],
        r"negatives from this rank's batch only: .* 4 rows against 4 candidates, the single-process "
        r"step's 8 rows against 8.*torch\.distributed\.nn\.functional\.all_gather"),
    "per_rank_normaliser": (
        [("    if world > 1:\n        dist.all_reduce(count)\n    return (per_pair * counted).sum() * world / count.clamp(min=1)\n",
          "    return (per_pair * counted).sum() / count.clamp(min=1)  # BUG: this rank's count\n")],
        r"normalised per rank.*taken over each rank's samples.*all-reduce the normaliser"),
}


def test_the_correct_trainer_passes_on_gloo_with_sync_batchnorm(suite_session):
    record, _ = suite_session.run_check(BY_ID["gradient-equivalence"], str(EXAMPLES / EXAMPLE))
    assert record.status == "passed", record.message
    evidence = record.evidence
    assert evidence["batchnorm_grouped"] == []
    assert evidence["batchnorm_synchronised"] == ["backbone.1", "projector.1"]
    assert evidence["sync_batchnorm_substituted"] == ["backbone.1", "projector.1"]
    seen = {(c["op"], c["api"], c["where"]) for c in evidence["step_collectives"]}
    assert ("all_gather", "autograd.Function GatherLayer", "the loss (outside every module)") in seen
    assert ("all_reduce", "torch.distributed.nn.functional", "the loss (outside every module)") in seen
    assert ("all_reduce", "autograd.Function GatherLayer", "the loss (outside every module)") in seen  # its backward


def test_the_unused_parameters_probe_runs_sync_batchnorm_on_gloo_too(suite_session):
    # Its discovery forward builds the model itself (not through DDP): seen on simsiam with
    # SyncBatchNorm, "SyncBatchNorm expected input tensor to be on GPU" as a target error.
    record, _ = suite_session.run_check(BY_ID["unused-parameters"], str(EXAMPLES / EXAMPLE))
    assert record.status == "passed", record.message


@pytest.mark.parametrize("case", sorted(CASES))
def test_each_bug_is_named(suite_session, tmp_path, case):
    edits, cause = CASES[case]
    path = variant(tmp_path, EXAMPLE, case, *edits)
    record, _ = suite_session.run_check(BY_ID["gradient-equivalence"], path)
    assert record.status == "failed", record.message
    assert "no known cause matched" not in record.message
    text = f"{record.message} {record.recommendation}"

    assert re.search(cause, text, re.S), text


def test_a_logged_all_reduce_is_not_blamed_for_another_bug(suite_session, tmp_path):
    # The loss multiplied by the world size (every gradient x2), and the loss all-reduced for
    # logging without detaching it: the recorded call is not what the factors show, so the
    # cause stays the world-size factor.
    path = variant(tmp_path, EXAMPLE, "times_world_logged",
                   ("    forward_loss(model, (views, counted)).backward()\n",
                    "    loss = forward_loss(model, (views, counted)) * _world()[1]  # BUG\n"
                    "    loss.backward()\n"
                    "    if _world()[1] > 1:\n"
                    "        dist.all_reduce(loss)  # for the log, not detached\n"))
    record, _ = suite_session.run_check(BY_ID["gradient-equivalence"], path)
    assert record.status == "failed", record.message
    assert "the loss is multiplied by the world size (factor 2 = N)" in record.message
    assert "not differentiable" not in record.message


def test_the_whole_batch_loss_on_every_rank_with_its_own_slot_reinserted_is_interpreted(suite_session, tmp_path):
    # open_clip's ClipLoss(local_loss=False, gather_with_grad=False): every rank computes the
    # whole batch's loss from gathered copies, its own slot put back. The towers get 1/N of
    # their gradient, the temperature (used in the loss alone) all of it: interpreted, not
    # left as "factors 0.5..1".
    text = (EXAMPLES / EXAMPLE).read_text()
    body = text[text.index("def contrastive_loss("):text.index("def centring(")]
    whole = ('def contrastive_loss(z1: torch.Tensor, z2: torch.Tensor, scale: torch.Tensor, counted: torch.Tensor) -> torch.Tensor:\n'
             '    rank, world = _world()\n'
             '    z1, z2 = F.normalize(z1, dim=1), F.normalize(z2, dim=1)\n'
             '    if world > 1:\n'
             '        g1, g2 = [torch.zeros_like(z1) for _ in range(world)], [torch.zeros_like(z2) for _ in range(world)]\n'
             '        dist.all_gather(g1, z1)\n'
             '        dist.all_gather(g2, z2)\n'
             '        g1[rank], g2[rank] = z1, z2  # BUG: only the own slot carries a gradient\n'
             '        z1, z2 = torch.cat(g1), torch.cat(g2)\n'
             '    labels = torch.arange(z1.shape[0])\n'
             '    return (F.cross_entropy(scale * z1 @ z2.T, labels) + F.cross_entropy(scale * z2 @ z1.T, labels)) / 2\n\n\n')
    path = variant(tmp_path, EXAMPLE, "whole_batch_loss", (body, whole),
                   ("    return contrastive_loss(z1, z2, scale, counted) + centring(z1, z2, view1.shape[0] * _world()[1])\n",
                    "    return contrastive_loss(z1, z2, scale, counted)\n"))
    record, _ = suite_session.run_check(BY_ID["gradient-equivalence"], path)
    assert record.status == "failed", record.message
    assert re.search(r"own slot, re-inserted .*: \d+ parameters at exactly 1/2 \(the ones behind the gathered "
                     r"features\), logit_scale at 1 \(used in the loss alone\)", record.message), record.message
