"""What a target's function *returned*, judged where the suite first uses it (issue 34 §4).

In one process, as a rank calls the target: ``build_optimizer`` returning None or a list, and
``make_batch`` changing its batch's shape between calls, are target errors naming the function
and its ``file:line`` ("returned ..."), never an error of DDP's step. The same through the
command line (exit 2, one line): ``test_target_errors_cli.py``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conformance.harness.targets import TargetError, load_target, make_batch_checked
from conformance.harness.world.validate import describe_target

HERE = Path(__file__).resolve().parent / "targets"


def _draw(target, seed: int, rows: int = 8):  # type: ignore[no-untyped-def]
    return make_batch_checked(target, torch.Generator().manual_seed(seed), rows)


@pytest.mark.parametrize(("name", "line", "returned"), [
    ("bad_optimizer_returns_none", 12, r"returned None, not an optimizer \(is its `return` missing\?\)"),
    ("bad_optimizer_returns_list", 13, r"returned a list, not an optimizer — return one optimizer, not a "
                                       r"collection of them"),
])
def test_build_optimizer_returning_no_optimizer_is_named_where_a_rank_gets_it(name, line, returned):
    target = load_target(str(HERE / f"{name}.py"))
    with pytest.raises(TargetError, match=rf"^target '{name}': build_optimizer \(defined at \S*{name}\.py:{line}\) "
                                          rf"{returned}; return the optimizer it builds, e\.g\. "
                                          rf"torch\.optim\.SGD\(params, lr=0\.1\) "
                                          rf"\(see the README section 'Writing a target'\)$"):
        target.make_optimizer(target.build_model())


def test_build_optimizer_returning_none_is_refused_before_any_world_starts():
    with pytest.raises(TargetError, match=r"build_optimizer \(defined at \S*bad_optimizer_returns_none\.py:12\) "
                                          r"returned None, not an optimizer"):
        describe_target(str(HERE / "bad_optimizer_returns_none.py"), 2, deadline=60)


def test_build_optimizer_raising_on_its_own_line_is_refused_before_any_world_starts():
    """Seen by a new user: a build_optimizer written for the model but named `params` surfaced
    29 s into the run, at its first call on a rank; the edge's child finds it in a second."""
    with pytest.raises(TargetError, match=r"build_optimizer raised AttributeError: 'generator' object has no "
                                          r"attribute 'named_modules' at \S*bad_optimizer_takes_model\.py:12"):
        describe_target(str(HERE / "bad_optimizer_takes_model.py"), 2, deadline=60)


def test_build_optimizer_that_needs_the_process_group_is_left_to_the_ranks(tmp_path):
    """A ZeroRedundancyOptimizer needs the process group the edge's child does not have: the
    child must not call that a target error (the ranks, which have one, judge it)."""
    target = tmp_path / "zero_target.py"
    target.write_text("import torch\nfrom torch.distributed.optim import ZeroRedundancyOptimizer\n"
                      "from conformance.targets.mlp import build_model, loss_fn, make_batch\n"
                      "def build_optimizer(params):\n"
                      "    return ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.SGD, lr=0.1)\n")
    assert describe_target(str(target), 2, deadline=60).name == "zero_target"


BY_HAND = ("import torch\nfrom torch import nn\n"
           "from conformance.targets.mlp import build_model, loss_fn, make_batch\n"
           "class ByHand:\n"
           "    def __init__(self, params):\n        self.params = list(params)\n"
           "    def step(self):\n"
           "        with torch.no_grad():\n"
           "            for p in self.params:\n                p -= 0.1 * p.grad\n"
           "def build_optimizer(params):\n    return ByHand(params)\n")


def test_an_optimizer_object_without_zero_grad_serves_a_step_that_does_not_call_it(tmp_path):
    own = tmp_path / "own_step.py"
    own.write_text(BY_HAND + "def train_step(model, optimizer, microbatches, loss_fn):\n"
                             "    model.zero_grad()\n"
                             "    for x, y in microbatches:\n        loss_fn(model(x), y).backward()\n"
                             "    optimizer.step()\n")
    target = load_target(str(own))
    model = target.build_model()
    target.run_step(model, target.make_optimizer(model), [_draw(target, 0)])  # no TargetError
    describe_target(str(own), 2, deadline=60)
    # The suite's default step calls zero_grad(): there the same object is not an optimizer.
    default = tmp_path / "default_step.py"
    default.write_text(BY_HAND)
    with pytest.raises(TargetError, match=r"returned a ByHand, not an optimizer: it has no zero_grad\(\)"):
        load_target(str(default)).make_optimizer(model)


def test_make_batch_changing_shape_is_named_with_what_it_returned_not_as_the_forwards_error():
    target = load_target(str(HERE / "bad_batch_changes_shape.py"))
    model = target.build_model()
    optimizer = target.make_optimizer(model)
    target.run_step(model, optimizer, [_draw(target, 0)])  # the first batch: 16 features
    with pytest.raises(TargetError, match=r"^target 'bad_batch_changes_shape': make_batch \(defined at "
                                          r"\S*bad_batch_changes_shape\.py:18\) returned inputs of shape \(8, 24\), "
                                          r"float32 on its 2nd call, where its first call returned inputs of shape "
                                          r"\(8, 16\), float32, and the model's forward then raised RuntimeError: "
                                          r"mat1 and mat2 shapes cannot be multiplied .*; return the same "
                                          r"structure, dtypes and shapes on every call"):
        target.run_step(model, optimizer, [_draw(target, 1)])


def test_a_batch_whose_length_varies_is_no_error_while_the_model_takes_it(tmp_path):
    """Padding each batch to its longest sequence is production practice: a changed layout is
    named only when something then fails on it."""
    path = tmp_path / "padded.py"
    path.write_text(
        "import torch\nfrom torch import nn\n"
        "class Pool(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n        self.proj = nn.Linear(4, 2)\n"
        "    def forward(self, x):\n        return self.proj(x.mean(dim=1))\n"
        "def build_model():\n    return Pool()\n"
        "def make_batch(g, n):\n"
        "    length = int(torch.randint(3, 9, (1,), generator=g))\n"
        "    return torch.randn(n, length, 4, generator=g), torch.randn(n, 2, generator=g)\n"
        "def loss_fn(outputs, targets):\n    return nn.functional.mse_loss(outputs, targets)\n")
    target = load_target(str(path))
    model = target.build_model()
    optimizer = target.make_optimizer(model)
    lengths = set()
    for seed in range(6):
        batch = _draw(target, seed)
        lengths.add(batch[0].shape[1])
        target.run_step(model, optimizer, [batch])
    assert len(lengths) > 1  # the layout did change, and nothing was refused
