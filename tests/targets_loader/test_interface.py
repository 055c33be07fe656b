"""The target interface in one process: what each optional name changes in how the suite calls
the target (README section 'Writing a target'), and what it refuses."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from conformance.harness.sharding import shard
from conformance.harness.targets import TargetError, call_target, load_target

HERE = Path(__file__).resolve().parent / "targets"


def _target(tmp_path: Path, body: str, name: str = "t.py"):  # type: ignore[no-untyped-def]
    path = tmp_path / name
    path.write_text("import torch\nfrom torch import nn\n"
                    "def build_model():\n    return nn.Linear(3, 2)\n"
                    "def make_batch(g, n):\n    return torch.randn(n, 3, generator=g), torch.randn(n, 2, generator=g)\n"
                    + body)
    return load_target(str(path))


def test_gpt_style_target_loss_in_forward_model_optimizer_step_index_own_folder():
    target = load_target(str(HERE / "gptlike" / "target.py"))
    assert str(HERE / "gptlike") in sys.path  # `from model import TinyLM` worked
    assert target.loss_fn is None and target.forward_loss is not None
    assert target.sampling == "with-replacement"
    torch.manual_seed(0)
    model = target.build_model()
    x, y = target.make_batch(torch.Generator().manual_seed(0), 4)
    loss = target.compute_loss(model, x, y)
    assert loss.dim() == 0 and float(loss) == pytest.approx(float(model(x, y)[1]))
    optimizer = target.make_optimizer(model)  # built from the model: two decay groups
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.1, 0.0]
    for step in (0, 1, 2):
        target.run_step(model, optimizer, [(x, y)], step=step)
    assert target.module.steps_seen == [0, 1, 2]


def test_legacy_target_gets_parameters_and_loss_fn(tmp_path):
    target = _target(tmp_path, "got = []\n"
                     "def loss_fn(o, t):\n    return nn.functional.mse_loss(o, t)\n"
                     "def build_optimizer(params):\n    got.append(params)\n    return torch.optim.SGD(params, lr=0.1)\n"
                     "def train_step(model, optimizer, microbatches, loss_fn):\n"
                     "    got.append(loss_fn(model(microbatches[0][0]), microbatches[0][1]))\n")
    model = target.build_model()
    optimizer = target.make_optimizer(model)
    assert not isinstance(target.module.got[0], torch.nn.Module)  # model.parameters()
    x, y = target.make_batch(torch.Generator().manual_seed(0), 4)
    target.run_step(model, optimizer, [(x, y)], step=5)  # no `step` parameter: not passed
    assert target.module.got[1].dim() == 0


def test_default_step_uses_forward_loss(tmp_path):
    target = _target(tmp_path, "calls = []\n"
                     "def forward_loss(model, microbatch):\n    calls.append(1)\n"
                     "    return nn.functional.mse_loss(model(microbatch[0]), microbatch[1])\n")
    model = target.build_model()
    before = model.weight.detach().clone()
    x, y = target.make_batch(torch.Generator().manual_seed(0), 4)
    target.run_step(model, target.make_optimizer(model), [(x[:2], y[:2]), (x[2:], y[2:])])
    assert target.module.calls == [1, 1] and not torch.equal(before, model.weight)


@pytest.mark.parametrize(("body", "message"), [
    ("sampling = 'random'\ndef loss_fn(o, t):\n    return o.sum()\n",
     r"sampling = 'random' is not one of 'epochs', 'with-replacement'"),
    ("sample_identity = 'hash'\ndef loss_fn(o, t):\n    return o.sum()\n",
     r"sample_identity = 'hash' is not one of 'content', 'index'"),
    ("def loss_fn(o, t):\n    return o.sum()\ndef train_step(model, batch):\n    pass\n",
     r"train_step must be callable as train_step\(model, optimizer, microbatches, loss_fn\).*"
     r"its signature is train_step\(model, batch\) \(at .*t\.py:9"),
    ("def forward_loss(model):\n    pass\n", r"forward_loss must be callable as forward_loss\(model, microbatch\)"),
    ("def loss_fn(o, t):\n    return o.sum()\nevaluate = {'accuracy': 0.5}\n",
     r"evaluate is a dict, not a function \(see the README section 'Writing a target'\)"),
    ("def loss_fn(o, t):\n    return o.sum()\ndef evaluate(model):\n    return {}\n",
     r"evaluate must be callable as evaluate\(model, ctx\), its signature is evaluate\(model\)"),
    ("pass\n", r"does not define loss_fn\(\).*or forward_loss\(model, microbatch\).*"
               r"see the README section 'Writing a target'"),
])
def test_loader_refuses_with_the_fix(tmp_path, body, message):
    with pytest.raises(TargetError, match=message):
        _target(tmp_path, body)


def test_user_exception_becomes_target_error_with_file_line():
    target = load_target(str(HERE / "bad_train_step_type_error.py"))
    model = target.build_model()
    x, y = target.make_batch(torch.Generator().manual_seed(0), 4)
    with pytest.raises(TargetError, match=r"train_step raised TypeError: loss_fn\(\) got an unexpected "
                                          r"keyword argument 'reduction' at .*bad_train_step_type_error\.py:12"):
        target.run_step(model, target.make_optimizer(model), [(x, y)])


def test_optimizer_written_for_the_model_is_named():
    target = load_target(str(HERE / "bad_optimizer_takes_model.py"))
    with pytest.raises(TargetError, match=r"build_optimizer raised AttributeError: 'generator' object has "
                                          r"no attribute 'named_modules' at .*bad_optimizer_takes_model\.py:12"
                                          r" — .*name its first parameter `model`"):
        target.make_optimizer(target.build_model())


def test_broadcasting_shapes_and_non_scalar_loss_are_target_errors():
    shapes = load_target(str(HERE / "bad_shapes.py"))
    x, y = shapes.make_batch(torch.Generator().manual_seed(0), 4)
    with pytest.raises(TargetError, match=r"loss_fn raised UserWarning: Using a target size .* at .*bad_shapes\.py:17"):
        shapes.compute_loss(shapes.build_model(), x, y)
    scalar = load_target(str(HERE / "bad_loss_not_scalar.py"))
    x, y = scalar.make_batch(torch.Generator().manual_seed(0), 4)
    with pytest.raises(TargetError, match=r"loss_fn \(defined at .*bad_loss_not_scalar\.py:11\) returned a "
                                          r"loss of shape \(4,\), not a scalar"):
        scalar.compute_loss(scalar.build_model(), x, y)


def _ddp_error(*_):  # type: ignore[no-untyped-def]
    raise RuntimeError("Expected to have finished reduction in the prior iteration before starting a new one")


def test_errors_that_are_not_the_users_propagate_unchanged(tmp_path):
    target = _target(tmp_path, "def loss_fn(o, t):\n    return o.sum()\n"
                     "def train_step(model, optimizer, microbatches, loss_fn, *, step, hook=None):\n"
                     "    hook()\n")
    model = target.build_model()
    optimizer = target.make_optimizer(model)
    # Raised by the suite's code called from the user's (an instrument, an injected fault):
    with pytest.raises(ValueError, match="not divisible"):
        call_target(target, "train_step", target.train_step, model, optimizer, [], None, step=0,
                    hook=lambda: shard((torch.zeros(3), torch.zeros(3)), 0, 2))
    # Not raised by the suite nor by DDP: the user's line that called it is blamed.
    with pytest.raises(TargetError, match=r"train_step raised ZeroDivisionError: division by zero at "
                                          r".*/t\.py:10;"):
        call_target(target, "train_step", target.train_step, model, optimizer, [], None, step=0,
                    hook=lambda: 1 / 0)
    # DDP's own error message, raised below the user's line: a finding, not a target error.
    with pytest.raises(RuntimeError, match="Expected to have finished reduction"):
        call_target(target, "train_step", target.train_step, model, optimizer, [], None, step=0,
                    hook=_ddp_error)


def test_target_errors_cite_a_real_readme_section():
    # (tests/test_architecture.py holds every citation in the code to the headings; this one
    # is the title every target error carries.)
    from conformance.harness import targets

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert targets.SEE.endswith("'Writing a target'")
    assert "\n## Writing a target\n" in readme


def test_every_target_error_in_the_loader_cites_the_readme_section():
    # Each `raise TargetError(...)` in the loader carries SEE, except where the user named a
    # target that does not exist (there is no target yet to fix).
    import ast

    from conformance.harness import targets

    # The loader is a package (harness/targets/): every module of it is read.
    trees = [ast.parse(path.read_text()) for path in sorted(Path(targets.__file__).parent.glob("*.py"))]
    missing, seen = [], 0
    for node in (node for tree in trees for node in ast.walk(tree)):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) \
                and getattr(node.exc.func, "id", "") == "TargetError" and node.exc.args:
            seen += 1
            names = {n.id for n in ast.walk(node.exc.args[0]) if isinstance(n, ast.Name)}
            text = ast.unparse(node.exc.args[0])
            if "SEE" not in names and "does not exist" not in text and "is not a built-in" not in text \
                    and "cannot be imported as Python" not in text and "error.message" not in text:
                missing.append(f"line {node.lineno}: {text[:80]}")
    assert seen > 20, seen  # the walk finds the loader's raises
    assert not missing, "\n".join(missing)


def test_user_code_is_the_targets_folder_never_the_suite_nor_installed_packages():
    # A target at the repository root: its folder then holds the suite and the virtualenv too.
    from ddp_conformance import faults
    from conformance.harness import target_calls

    root = str(Path(target_calls.__file__).resolve().parents[2])
    assert target_calls.is_user_file(f"{root}/my_target.py", frozenset(), root)
    assert target_calls.is_user_file(f"{root}/conformance/targets/mlp.py", frozenset(), root)
    assert not target_calls.is_user_file(target_calls.__file__, frozenset(), root)
    assert not target_calls.is_user_file(faults.__file__, frozenset(), root)
    assert not target_calls.is_user_file(torch.__file__, frozenset(), str(Path(torch.__file__).parents[3]))
    assert not target_calls.is_user_file(f"{root}/my_target.py", frozenset(), None)
    assert target_calls.is_user_file(torch.__file__, frozenset({torch.__file__}), None)
