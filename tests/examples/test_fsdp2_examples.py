"""The DDP -> FSDP2 ports (``examples/train_fsdp2.py``, ``examples/train_replicate.py``) and a
target's ``parallelize`` through the equivalence checks: the correct ports pass, naming the
wrapper that trained them, and each bug a port makes is caught naming its cause (issue 40).

The correct ports run in the CI subset; the bug variants are the example with one deliberate
change (``_variants.py``), run on the shared gloo 2-rank session."""

from __future__ import annotations

import re

import pytest

from conformance.harness.registry import BY_ID

from ..checks._check_helpers import target_spec
from ._variants import EXAMPLES, variant

#: (target, check id, the wrapper the report must name)
PORTS = {
    "fsdp2_gradient": (str(EXAMPLES / "train_fsdp2.py"), "gradient-equivalence", "fully_shard"),
    "fsdp2_no_sync": (str(EXAMPLES / "train_fsdp2.py"), "no-sync-equivalence", "fully_shard"),
    "replicate_gradient": (str(EXAMPLES / "train_replicate.py"), "gradient-equivalence", "replicate_with_fsdp"),
    "replicate_no_sync": (str(EXAMPLES / "train_replicate.py"), "no-sync-equivalence", "replicate_with_fsdp"),
    # --compare-ddp's second run: the same target through DDP, its parallelize set aside.
    "fsdp2_via_ddp": (str(EXAMPLES / "train_fsdp2.py") + "#ddp", "gradient-equivalence", "DDP"),
    # The suite's default train_step on a parallelized model: FSDP2's accumulation switch.
    # The loop's own checkpoint (the full state dict, gathered on every rank), killed and resumed.
    "fsdp2_resume": (str(EXAMPLES / "train_fsdp2.py"), "resume-equivalence", None),
    "fully_shard_default_step": (target_spec("fsdp2_default_step"), "no-sync-equivalence", "fully_shard"),
    "ddp_based_replicate_default_step": (target_spec("replicate_ddp_based"), "no-sync-equivalence", "replicate"),
}


@pytest.mark.parametrize("case", PORTS)
def test_correct_port_passes_naming_its_wrapper(suite_session, case):
    target, check_id, wrapper = PORTS[case]
    record, _ = suite_session.run_check(BY_ID[check_id], target)
    assert record.status == "passed", (record.status, record.message)
    if wrapper is None:  # resume-equivalence: every resumed step compared
        assert "equal to step 6 on 2 ranks" in record.message, record.message
        return
    assert record.evidence["wrapper"] == wrapper
    assert f" {wrapper} " in record.message or check_id == "no-sync-equivalence", record.message
    if check_id == "no-sync-equivalence":
        # One reduction round per K microbatches, observed (not a round-less pass).
        assert all(r == [1, 1] for r in record.metrics["allreduce_rounds_per_step"]), record.metrics


_LOSS = "            loss = F.cross_entropy(self.model(source), targets) / k\n"
_CLIP = "        nn.utils.clip_grad_norm_(self.model.parameters(), GRAD_CLIP)\n"
#: case -> (example, check id, edits, regex the message must match: the real cause)
BUGS = {
    # DDP-era habit: the loss scaled by the world size "because the all-reduce sums".
    "fsdp2_loss_times_world": (
        "train_fsdp2.py", "gradient-equivalence",
        [(_LOSS, _LOSS.replace("/ k\n", "/ k * torch.distributed.get_world_size()\n"))],
        r"the loss is multiplied by the world size \(factor 2 = N\): fully_shard already averages"),
    # A hand-written clip on the local shard: each rank clips by its own shard's norm.
    "fsdp2_clip_by_local_shard_norm": (
        "train_fsdp2.py", "gradient-equivalence",
        [(_CLIP, "        grads = [p.grad.to_local() for p in self.model.parameters() if p.grad is not None]\n"
                 "        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))\n"
                 "        for g in grads:\n"
                 "            g.mul_((GRAD_CLIP / (norm + 1e-6)).clamp(max=1.0))\n")],
        r"each rank scaled its own gradient shard by a factor of its own \(rank 0: [\d.]+, rank 1: [\d.]+;"
        r".*clipped by the rank's local shard norm"),
    # DDP's checkpoint kept through the port: rank 0 saves model.state_dict(), now its own shards.
    "fsdp2_rank0_shard_checkpoint": (
        "train_fsdp2.py", "resume-equivalence",
        [("    model_state, optim_state = get_state_dict(model, optimizer,\n"
          "                                              options=StateDictOptions(full_state_dict=True, cpu_offload=True))\n",
          "    model_state, optim_state = model.state_dict(), optimizer.state_dict()\n"),
         ('        raw.load_state_dict(state["model"])  # the full weights, before parallelize shards them\n',
          "        pass  # loaded after wrapping, below\n"),
         ("        set_optimizer_state_dict(model, optimizer, state[\"optimizer\"],\n"
          "                                 options=StateDictOptions(full_state_dict=True))\n",
          "        model.load_state_dict(state[\"model\"])\n        optimizer.load_state_dict(state[\"optimizer\"])\n"),
         ('torch.load(path, map_location="cpu", weights_only=True)', 'torch.load(path, map_location="cpu", weights_only=False)')],
        r"only rank\(s\) \[0\] saved the checkpoint, and it holds \d+ FSDP2 shard\(s\) \(DTensors\)"),
    # DDP's order kept through the port: the optimizer built on the parameters before wrapping.
    # fully_shard replaces them with DTensors, so the optimizer steps tensors the model no longer
    # holds; the model never trains, and its ranks agree on that (every other check passes).
    "fsdp2_optimizer_built_before_fully_shard": (
        "train_fsdp2.py", "rank-consistency",
        [("    model = ctx.wrap(raw)\n    optimizer = build_optimizer(model.parameters())\n",
          "    optimizer = build_optimizer(raw.parameters())\n    model = ctx.wrap(raw)\n")],
        r"run_loop's optimizer on rank 0, at its first step: the optimizer steps 8 of its 8 tensor\(s\) that "
        r"are not parameters of the trained model but plain tensors of its sharded parameters' shapes .*"
        r"built on the parameters before fully_shard/replicate replaced them"),
    "replicate_loss_times_world": (
        "train_replicate.py", "gradient-equivalence",
        [("from train_fsdp2 import Trainer, build_model, build_optimizer, loss_fn, make_batch, train_step\n",
          "from train_fsdp2 import Trainer, build_model, build_optimizer, loss_fn, make_batch\n\n\n"
          "def train_step(model, optimizer, microbatches, loss_fn):\n"
          "    optimizer.zero_grad()\n"
          "    for x, y in microbatches:\n"
          "        (loss_fn(model(x), y) * torch.distributed.get_world_size()).backward()\n"
          "    optimizer.step()\n")],
        r"the loss is multiplied by the world size \(factor 2 = N\): replicate_with_fsdp already averages"),
}


def test_fully_shard_accumulation_with_gradient_sync_on_is_a_cost_not_a_failure(suite_session, tmp_path):
    # model.no_sync() has no FSDP2 counterpart by that name; dropped in the port, every backward
    # reduce-scatters (torchtitan's default): the result is right, the cost is K rounds, not 1.
    target = variant(tmp_path, "train_fsdp2.py", "sync_on",
                     ("                self.model.set_requires_gradient_sync(i == k - 1)\n", "                pass\n"))
    record, _ = suite_session.run_check(BY_ID["no-sync-equivalence"], target)
    assert record.status == "passed", (record.status, record.message)
    assert re.search(r"K=4 microbatches match the single-process step \(.*\): correct\. Cost: fully_shard "
                     r"reduce-scattered on every backward, 4 reduction rounds \(12 reduce-scatters\) per "
                     r"optimizer step instead of 1 .*not a correctness bug", record.message), record.message
    assert record.metrics["sync_cost"] == {"rounds_per_step": 4, "reductions_per_step": 12, "instead_of_rounds": 1}
    assert "set_requires_gradient_sync(i == k - 1)" in (record.recommendation or "")


@pytest.mark.slow  # the correct ports above are the CI subset's FSDP2 run
@pytest.mark.parametrize("case", BUGS)
def test_port_bug_is_caught_naming_its_cause(suite_session, tmp_path, case):
    example, check_id, edits, cause = BUGS[case]
    target = variant(tmp_path, example, case, *edits)
    record, _ = suite_session.run_check(BY_ID[check_id], target)
    assert record.status == "failed", (record.status, record.message)
    assert re.search(cause, record.message), record.message


def test_compare_ddp_runs_every_check_both_ways():
    from conformance.harness.registry import select
    from conformance.harness.session import Settings

    spec = BY_ID["gradient-equivalence"]
    assert Settings(target="t.py", compare_ddp=True).targets_for(spec) == ["t.py", "t.py#ddp"]
    assert Settings(target="t.py").targets_for(spec) == ["t.py"]
    # The migration table runs both ways itself, once, and only with --compare-ddp (or named).
    assert Settings(target="t.py", compare_ddp=True).targets_for(BY_ID["ddp-migration"]) == ["t.py"]
    assert [s.id for s in select("gradient-equivalence", compare_ddp=True)] == ["gradient-equivalence",
                                                                               "ddp-migration"]
    assert "ddp-migration" not in [s.id for s in select(None, "full")]


def test_migration_puts_ddp_beside_the_port(suite_session):
    record, _ = suite_session.run_check(BY_ID["ddp-migration"], str(EXAMPLES / "train_fsdp2.py"))
    assert record.status == "passed", (record.status, record.message)
    rows = record.metrics["migration"]
    assert [(r["wrapper"], r["rank"]) for r in rows] == [("DDP", 0), ("DDP", 1), ("fully_shard", 0), ("fully_shard", 1)]
    # What each wrapper issued per step: DDP one bucket all-reduce; fully_shard all-gathers (the
    # blocks' and the root's, forward and backward) and one reduce-scatter per group (3 groups).
    assert rows[0]["collectives_per_step"] == {"bucket all-reduces": 1.0}, rows[0]
    assert rows[2]["collectives_per_step"]["reduce-scatters"] == 3.0, rows[2]
    assert rows[2]["collectives_per_step"]["all-gathers"] >= 3, rows[2]
    assert all(r["peak_rss"] > 0 and r["step_s"] > 0 for r in rows), rows
    hazards = record.evidence["warnings"]
    assert [h.split(":")[0] for h in hazards] == [
        "ddp_kwargs find_unused_parameters=False has no FSDP2 meaning", "clipping on DTensors",
        "optimizer state dict format"], hazards


@pytest.mark.slow
def test_migration_fails_where_the_port_trains_other_weights_than_ddp(suite_session, tmp_path):
    # A DDP habit kept only on the port's branch: the loss scaled by the world size under FSDP2
    # (without the clip, which engaged on both ways would scale the factor away).
    target = variant(tmp_path, "train_fsdp2.py", "parted",
                     (_LOSS, _LOSS.replace("/ k\n", "/ k * (torch.distributed.get_world_size() if "
                                                   "hasattr(self.model, 'set_requires_gradient_sync') else 1)\n")),
                     (_CLIP, ""))
    record, _ = suite_session.run_check(BY_ID["ddp-migration"], target)
    assert record.status == "failed", (record.status, record.message)
    assert re.search(r"after 4 steps from the same weights, \d+ parameter\(s\) differ between DDP and "
                     r"fully_shard beyond 0\.0001 relative", record.message), record.message
