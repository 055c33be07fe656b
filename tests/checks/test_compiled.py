"""``_compiled``: graph breaks told apart by whose code broke, the eager reference, and the
evidence the judge builds from the ranks' summaries. One process, no world: dynamo's own records
on tiny modules (the ``eager`` backend, well under a second each)."""

from __future__ import annotations

import traceback
from types import SimpleNamespace

import torch
from torch import nn

from conformance.checks._compiled import (
    MODULE,
    _breaks,
    compile_evidence,
    compile_warnings,
    compiled_form,
    watch_compile,
)
from reports.keys import COMPILED, DDP_BUCKET_SPLITS, GRAPH_BREAKS


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
