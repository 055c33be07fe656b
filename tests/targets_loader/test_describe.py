"""The supervisor's view of a target, loaded in a forked child (``world/validate.py``): what
comes back, and what a child that ends without answering means (issue 18, item 1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.harness.targets import TargetError, TargetInfo, load_target
from conformance.harness.world.validate import describe_target

MLP_NAMES = "from conformance.targets.mlp import build_model, ddp_kwargs, loss_fn, make_batch\n"


def _target(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(MLP_NAMES + body)
    return str(path)


def test_the_description_is_the_targets_names_and_settings(tmp_path: Path) -> None:
    spec = _target(tmp_path, "described", "global_batch_size = 8\nsampling = 'with-replacement'\n"
                   "def epoch_batches(rank, world_size, epoch):\n    return []\n")
    info = describe_target(spec, 2, deadline=60)
    assert info == load_target(spec).info()  # the same as loading it here
    assert info.defines == frozenset({"epoch_batches", "loss_fn"}) and info.has("epoch_batches")
    assert not info.has("train_step")  # the suite's default step is not the target's
    assert (info.global_batch_size, info.sampling, info.ddp_kwargs) == (8, "with-replacement",
                                                                        {"find_unused_parameters": False})
    assert TargetInfo.from_json(info.to_json()) == info


@pytest.mark.parametrize("body, said", [
    ("import os\nprint('bye', flush=True)\nos._exit(0)\n",
     r"the process exited with status 0; nothing was verified\); it printed: 'bye'"),
    ("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n", r"the process was killed by SIGSEGV"),
    ("import sys\nprint('half')\nsys.exit(3)\n", r"called sys.exit\(3\); .*it printed: 'half'"),
])
def test_a_child_that_ends_without_answering_is_a_target_error(tmp_path: Path, body: str, said: str) -> None:
    spec = _target(tmp_path, "ends", body)
    with pytest.raises(TargetError, match=rf"ended its process before it could be checked \({said}"):
        describe_target(spec, 2, deadline=60)


def test_a_parent_that_ran_torch_ops_still_loads_a_target_in_its_forked_child(tmp_path: Path) -> None:
    """The loader child is forked. A parent whose intra-op (OpenMP) pool was running — a pytest
    process that ran torch ops, the user's own tests — left the child's first parallel op
    waiting forever on threads that were not forked: a correct target "did not finish loading
    within the deadline". The child now runs one intra-op thread before any user code."""
    import torch

    torch.ones(256, 256) @ torch.ones(256, 256)  # the parent's pool is up
    torch.nn.functional.conv2d(torch.ones(8, 3, 32, 32), torch.ones(8, 3, 3, 3))
    spec = _target(tmp_path, "builds_a_conv", "import torch\n"
                   "_ = torch.nn.functional.conv2d(torch.ones(8, 3, 32, 32), torch.ones(8, 3, 3, 3))\n")
    assert describe_target(spec, 2, deadline=20).name
