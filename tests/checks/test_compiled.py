"""``equivalence.compiled``: graph breaks told apart by whose code broke, the eager reference, and the
evidence the judge builds from the ranks' summaries. One process, no world: dynamo's own records
on tiny modules (the ``eager`` backend, well under a second each); one slow test on a real world."""

from __future__ import annotations

import re
import traceback
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from conformance.checks.equivalence.compiled import (
    MODULE,
    _breaks,
    compile_evidence,
    compile_warnings,
    compiled_form,
    watch_compile,
)
from ddp_conformance.reports.keys import COMPILED, DDP_BUCKET_SPLITS, GRAPH_BREAKS


class Logs(nn.Module):
    """A forward with a host sync in it: dynamo must break the graph at the ``.item()``."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.seen = 0.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        self.seen = h.abs().max().item()  # the graph break
        return torch.relu(h)


def _line_of(text: str) -> int:
    import inspect

    lines, start = inspect.getsourcelines(Logs.forward)
    return start + next(i for i, line in enumerate(lines) if text in line)


def test_user_break_named_by_line_framework_break_counted_apart(tmp_path):
    user = tmp_path / "train.py"
    user.write_text("x = 1\n" * 10)
    in_torch = traceback.FrameSummary(torch.__file__, 5, "forward")
    reasons = [SimpleNamespace(reason="Unsupported Tensor.item() call\nmore", user_stack=[
                   in_torch, traceback.FrameSummary(str(user), 7, "forward")]),
               SimpleNamespace(reason="Failed to trace builtin operator", user_stack=[
                   traceback.FrameSummary(str(user), 7, "forward"), in_torch]),
               SimpleNamespace(reason="DDPOptimizer intentional graph-break", user_stack=[in_torch])]
    user_breaks, other = _breaks(reasons)
    assert user_breaks == [{"where": "train.py:7", "count": 2,
                            "reasons": ["Unsupported Tensor.item() call", "Failed to trace builtin operator"]}]
    assert other == 1


def test_eager_module_is_left_alone():
    model = nn.Linear(2, 2)
    assert compiled_form(model, model) is None
    with watch_compile(model, model, eager=False) as found:
        model(torch.randn(1, 2))
    assert found == {}


def test_compiled_run_reports_the_break_at_its_line_and_the_eager_run_compiles_nothing():
    from torch._dynamo.utils import counters

    model = torch.compile(Logs(), backend="eager")
    trained = nn.Sequential(model)  # in place of the DDP model around the compiled module
    assert compiled_form(trained, model) == MODULE
    before = counters["stats"]["unique_graphs"]
    with watch_compile(trained, model, eager=True) as eager:
        model(torch.randn(2, 4))
    assert eager["ran"] == "eager" and counters["stats"]["unique_graphs"] == before
    with watch_compile(trained, model, eager=False) as found:
        model(torch.randn(2, 4))
    assert found["ran"] == "compiled" and found["backend"] == "eager" and found["graphs"] >= 2
    where = f"test_compiled.py:{_line_of('the graph break')}"
    assert [b["where"] for b in found["graph_breaks"]] == [where], found
    assert found["bucket_splits"] == []  # no DDP: DDPOptimizer never ran


def test_evidence_and_warning_from_the_ranks():
    rank = {"compile": {"form": MODULE, "backend": "aot_eager", "ran": "compiled", "graphs": 2,
                        "other_breaks": 0, "optimize_ddp": "True", "bucket_splits": [1, 1],
                        "graph_breaks": [{"where": "train.py:7", "count": 2, "reasons": ["Tensor.item()"]}]}}
    assert compile_evidence([{}, {}], {}) == {}
    assert compile_warnings({}) == []
    evidence = compile_evidence([rank, rank], {"compile": {"ran": "eager"}})
    assert evidence[COMPILED]["reference_ran"] == "eager" and evidence[COMPILED]["form"] == MODULE
    assert evidence[GRAPH_BREAKS] == [{"where": "train.py:7", "count": 2, "reasons": ["Tensor.item()"]}]
    assert evidence[DDP_BUCKET_SPLITS] == [[1, 1], [1, 1]]
    (warning,) = compile_warnings(evidence)
    assert "train.py:7 (Tensor.item())" in warning and "1 place(s)" in warning


def _hang(stacks):
    from conformance.harness.world import WorldHang

    return WorldHang("deadline", stuck_ranks=[0], results=[], stacks=stacks, elapsed_s=60.0)


COMPILING = ('  File "/venv/torch/_dynamo/convert_frame.py", line 2102 in _compile\n'
             '  File "/home/me/project/train.py", line 40 in train_step\n')
IN_COLLECTIVE = ('  File "/venv/torch/_dynamo/eval_frame.py", line 1166 in compile_wrapper\n'
                 '  File "/venv/torch/distributed/distributed_c10d.py", line 2950 in all_reduce\n')


def test_a_rank_still_compiling_at_the_deadline_is_inconclusive_not_a_hang():
    from conformance.harness.failures import slow_compile_outcome
    from conformance.harness.failures import world_error_outcome

    outcome = world_error_outcome(_hang({0: COMPILING, 1: IN_COLLECTIVE}), "the DDP training step")
    assert outcome.status == "inconclusive"
    assert re.search(r"rank\(s\) \[0\] were still compiling .* not a DDP hang; raise --deadline",
                     outcome.message), outcome.message
    # Running compiled code (eval_frame) in a collective is a hang like any other.
    assert slow_compile_outcome(_hang({0: IN_COLLECTIVE, 1: COMPILING}), "x") is None  # rank 1 not stuck
    assert world_error_outcome(_hang({0: IN_COLLECTIVE}), "the DDP training step").status == "failed"


#: A rank in the suite's warm-up, importing torch._dynamo (DDP's constructor does): the file
#: is dynamo's, the frame is its import, not a compile (issue 18, probe 14).
IMPORTING_DYNAMO = ('  File "/venv/torch/_dynamo/convert_frame.py", line 1 in <module>\n'
                    '  File "<frozen importlib._bootstrap>", line 241 in _call_with_frames_removed\n'
                    '  File "/venv/torch/nn/parallel/distributed.py", line 850 in __init__\n')


def test_importing_dynamo_is_not_still_compiling():
    from conformance.harness.failures import slow_compile_outcome
    from conformance.harness.failures import world_error_outcome

    assert slow_compile_outcome(_hang({0: IMPORTING_DYNAMO}), "x") is None
    outcome = world_error_outcome(_hang({0: IMPORTING_DYNAMO}), "the DDP training step")
    assert "compiling" not in outcome.message, outcome.message


@pytest.mark.slow
def test_a_compile_slower_than_the_deadline_is_inconclusive_on_a_real_world():
    """~15 s: a 6 s deadline (a tiny model's eager calls take < 1 s), and the stuck rank's world
    is killed and replaced."""
    from conformance.harness.registry import BY_ID
    from conformance.harness.session import Session, Settings

    from ..conftest import target_path

    session = Session(Settings(backend="gloo", world_size=2, deadline=6.0))
    try:
        record, _ = session.run_check(BY_ID["gradient-equivalence"], target_path("slow_compile"))
    finally:
        session.close()
    assert record.status == "inconclusive", record.message
    assert re.search(r"still compiling .* not a DDP hang", record.message), record.message


def test_a_compiled_model_of_which_dynamo_compiled_nothing_is_said_to_have_run_eagerly():
    rank = {"compile": {"form": MODULE, "ran": "compiled", "graphs": 0, "graph_breaks": []}}
    (warning,) = compile_warnings(compile_evidence([rank, rank], {}))
    assert re.search(r"compiled no graph on any rank: the model ran eagerly", warning), warning
    compiled = dict(rank["compile"], graphs=1)
    assert compile_warnings(compile_evidence([{"compile": compiled}, rank], {})) == []
