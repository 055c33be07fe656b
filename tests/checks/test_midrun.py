"""rank-consistency's mid-run judge (``conformance/checks/midrun.py``) on hand-made checkpoints,
no world: aligned per Join block (a rank's tail after its peers left Join is never compared
with their next block), scalers not compared at Join's exit (the loop re-syncs them after it),
and a difference named with its step, rank, parameter and scales."""

from __future__ import annotations

from typing import Any

from conformance.checks.midrun import describe, judge


def point(kind: str, block: int, index: int | None, rank_step: int, w: str = "a", *, scale: float | None = 2.0 ** 16,
          skipped: bool | None = False) -> dict[str, Any]:
    return {"kind": kind, "block": block, "index": index, "rank_step": rank_step,
            "params": {"0.weight": w, "0.bias": "b"},
            "scalers": [] if scale is None else [{"scale": scale, "growth_tracker": 0}],
            "skipped": skipped if kind == "step" else None}


def join_run(*, second_block_w1: str = "c", scale1: float = 2.0 ** 18, end_w1: str = "e") -> list[dict[str, Any]]:
    """Two ranks, two Join blocks: rank 0 runs 2 steps per block, rank 1 runs 3 (a tail)."""
    rank0 = [point("step", 1, 0, 0), point("step", 1, 1, 1, "b1"), point("join-exit", 1, None, 2, "x",
                                                                          scale=2.0 ** 18),
             point("step", 3, 0, 2, "c", scale=2.0 ** 19), point("step", 3, 1, 3, "d", scale=2.0 ** 19),
             point("join-exit", 3, None, 4, "e"), point("end", 4, None, 4, "e")]
    rank1 = [point("step", 1, 0, 0), point("step", 1, 1, 1, "b1"), point("step", 1, 2, 2, "tail"),
             point("join-exit", 1, None, 3, "x", scale=2.0 ** 19),
             point("step", 3, 0, 3, second_block_w1, scale=scale1),
             point("step", 3, 1, 4, "d", scale=scale1), point("step", 3, 2, 5, "tail2"),
             point("join-exit", 3, None, 6, end_w1), point("end", 4, None, 6, end_w1)]
    return [{"points": rank0, "error": None}, {"points": rank1, "error": None}]


def test_tails_and_scalers_at_join_exit_are_no_false_alarm() -> None:
    # Rank 1's tail steps have no partner; the scales differ right at Join's exit (before the
    # loop re-syncs them) and agree from the next step on: nothing differs.
    found = judge(join_run(scale1=2.0 ** 19))
    assert found.first is None, found.first
    assert found.checkpoints == 2 + 1 + 2 + 1 + 1  # two steps, exit, two steps, exit, end
    assert found.join_blocks == 2 and found.steps_per_rank == {0: 4, 1: 6}
    assert found.end_params_agree and found.end_scalers_agree


def test_scale_drift_after_join_named_with_step_rank_parameter_and_scales() -> None:
    found = judge(join_run(second_block_w1="c-drifted"))
    assert found.first is not None and found.first_parameter is found.first
    d = found.first
    assert (d.label, d.rank, d.parameter) == ("optimizer step 0 of Join block 2", 1, "0.weight")
    assert d.scales == {0: 2.0 ** 19, 1: 2.0 ** 18} and d.rank_steps == {0: 2, 1: 3}
    assert found.end_params_agree is True
    message, rec = describe(found)
    assert message == ("mid-run drift across ranks in run_loop: at optimizer step 0 of Join block 2 (rank 0's "
                       "step 2, rank 1's step 3 of the loop) parameter '0.weight' differs between rank 0 and "
                       "rank 1; loss scales rank 0 524288 (2^19), rank 1 262144 (2^18); at the end of run_loop "
                       "the parameters agree again on every rank (Join re-synced the model at exit), so a look "
                       "at the model after the loop sees nothing")
    assert "GradScaler state identical on every rank" in rec and "Join" in rec


def test_scaler_state_alone_differing_at_a_step_fails() -> None:
    found = judge(join_run(scale1=2.0 ** 20))
    assert found.first is not None and found.first.parameter is None and found.first_parameter is None
    message, _ = describe(found)
    assert message.startswith("mid-run drift across ranks in run_loop: the GradScaler state differs at "
                              "optimizer step 0 of Join block 2")
    assert "rank 0 524288 (2^19), rank 1 1.04858e+06 (2^20)" in message


def test_parameters_differing_at_the_end_only() -> None:
    found = judge(join_run(end_w1="e-other", scale1=2.0 ** 19))
    assert found.first is not None and found.first.kind == "join-exit" and found.first.parameter == "0.weight"
    assert found.end_params_agree is False


def test_skipped_steps_on_one_rank_only_are_named() -> None:
    runs = join_run(second_block_w1="c-drifted")
    runs[1]["points"][2]["skipped"] = True  # rank 1's tail step: inf/NaN gradients, skipped
    found = judge(runs)
    assert found.skipped == {1: ["optimizer step 2 of Join block 1"]}
    assert "steps skipped on inf/NaN gradients differ: rank 1 at optimizer step 2 of Join block 1" in describe(found)[0]


def test_a_loop_without_join_or_scaler_compares_every_step() -> None:
    ranks = [{"points": [point("step", 0, i, i, f"w{i}", scale=None, skipped=None) for i in range(3)]
              + [point("end", 0, None, 3, "w2", scale=None)], "error": None} for _ in range(2)]
    assert judge(ranks).first is None and judge(ranks).checkpoints == 4
    ranks[1]["points"][1]["params"] = {"0.weight": "w1", "0.bias": "other"}
    found = judge(ranks)
    assert found.first is not None and (found.first.label, found.first.parameter) == ("optimizer step 1", "0.bias")
    assert found.first.scales is None


def test_a_rank_that_raised_leaves_the_end_undecided() -> None:
    runs = join_run()
    runs[1] = {"points": runs[1]["points"][:3], "error": "RuntimeError: timed out"}
    found = judge(runs)
    assert found.errors == {1: "RuntimeError: timed out"} and found.end_params_agree is None


def test_the_watch_records_each_step_once_and_a_skipped_scaler_step_and_leaves_torch_as_it_was() -> None:
    # No world needed: a GradScaler and an optimizer on CPU, one step with an inf gradient.
    import torch
    from torch.amp.grad_scaler import GradScaler
    from torch.distributed.algorithms.join import Join

    from conformance.checks.midrun import Recorder, watching

    originals = (GradScaler.__dict__["step"], Join.__dict__["__enter__"], Join.__dict__["__exit__"])
    model = torch.nn.Linear(2, 1)
    recorder = Recorder([model])
    with watching(recorder):
        plain = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(1, 2)).sum().backward()
        plain.step()  # a plain optimizer step: one checkpoint, by the global post-hook
        scaler = GradScaler("cpu", growth_interval=1)
        scaled = torch.optim.SGD(model.parameters(), lr=0.1)
        for value in (1.0, float("inf")):
            scaled.zero_grad()
            scaler.scale(model(torch.full((1, 2), value)).sum()).backward()
            scaler.step(scaled)  # one checkpoint each, the inner optimizer.step not counted again
            scaler.update()
    plain.step()  # after the block: the global post-hook is gone
    assert [p["kind"] for p in recorder.points] == ["step", "step", "step"]
    assert [p["skipped"] for p in recorder.points] == [None, False, True]
    assert [p["scalers"] for p in recorder.points] == [
        [], [{"scale": 65536.0, "growth_tracker": 0}], [{"scale": 131072.0, "growth_tracker": 0}]]
    assert recorder.points[0]["params"].keys() == {"weight", "bias"}
    assert (GradScaler.__dict__["step"], Join.__dict__["__enter__"], Join.__dict__["__exit__"]) == originals


def calls_run(calls1: dict[str, int], *, w1: str = "b1", error: str | None = None) -> list[dict[str, Any]]:
    """Two ranks of a loop without an optimizer step: checkpoints at training forwards' starts."""
    def fwd(index: int, w: str, calls: dict[str, int]) -> dict[str, Any]:
        return {**point("forward", 0, index, 0, w, scale=None), "calls": calls}

    both = {"training forward": 2}
    rank0 = [fwd(0, "a", {}), fwd(1, "b1", {**both, "forward outside training": 3, "all_reduce": 1})]
    rank1 = [fwd(0, "a", {}), fwd(1, w1, {**both, **calls1})]
    return [{"points": rank0, "error": error, "calls": rank0[-1]["calls"]},
            {"points": rank1, "error": None, "calls": rank1[-1]["calls"]}]


def test_forwards_outside_training_and_collectives_on_some_ranks_are_named() -> None:
    found = judge(calls_run({}, w1="b1-drifted"))
    assert found.by_forward and found.first is not None and found.first.label == (
        "the first training forward after 1 hand-written update(s)")
    message, rec = describe(found)
    assert message.endswith(
        "before that checkpoint rank 0 ran 3 forward passes outside training (no_grad or eval mode: an "
        "evaluation) that rank 1 did not; rank 1 issued 1 fewer torch.distributed.all_reduce call than rank 0: "
        "a collective called on some ranks only")
    assert "all_reduce its loss before acting on it" in rec and "in the same order" in rec


def test_counts_that_differ_without_drift_are_no_finding() -> None:
    found = judge(calls_run({}))
    assert found.first is None and found.steps_per_rank == {0: 2, 1: 2}


def test_counts_that_agree_add_nothing_to_the_generic_message() -> None:
    found = judge(calls_run({"forward outside training": 3, "all_reduce": 1}, w1="b1-drifted"))
    message, rec = describe(found)
    assert "before that checkpoint" not in message and rec.startswith("every backward that ends")


def test_forward_checkpoints_are_ignored_where_an_optimizer_stepped() -> None:
    runs = calls_run({}, w1="b1-drifted")
    for run in runs:
        run["points"].append(point("step", 0, 0, 0, "s"))
    found = judge(runs)
    assert not found.by_forward and found.first is None and found.steps_per_rank == {0: 1, 1: 1}


def test_a_rank_further_along_is_not_a_collective_on_some_ranks_only() -> None:
    # Rank 1 ran one more training forward (uneven inputs, or stopped elsewhere): the rank that
    # is ahead issued more of everything, so only the training forwards are said.
    found = judge(calls_run({"training forward": 3}, w1="b1-drifted"))
    message, rec = describe(found)
    assert message.endswith("before that checkpoint the ranks ran different numbers of training forwards "
                            "(rank 0 2, rank 1 3), so what else each did is not compared")
    assert "all_reduce" not in message and rec.startswith("every backward that ends")


def test_forward_checkpoints_are_taken_once_per_update() -> None:
    # A rank's extra training forward with no update in between (accumulation, a forward for
    # its logs) takes no checkpoint: checkpoint i is "after i updates" on every rank.
    import torch

    from conformance.checks.midrun import Recorder

    model = torch.nn.Linear(2, 1)
    recorder = Recorder([model])
    recorder.training_forward()
    recorder.training_forward()  # the same parameters: no new checkpoint
    with torch.no_grad():
        model.weight -= 0.1
    recorder.training_forward()
    assert [p["index"] for p in recorder.points] == [0, 1]
