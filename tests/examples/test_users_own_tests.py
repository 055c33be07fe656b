"""A user's own pytest tests with the plugin's fixtures, end to end (pytester subprocess): the
``ddp_world`` fixture runs their function on 2 ranks, and ``conformance.testing.assert_check``
makes one check on their target the test's verdict — passed, failed with the check's message,
skipped with its reason, or failed with the one-line target error."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

TARGET_HEAD = '''
import torch
from torch import nn

def build_model():
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))

def make_batch(generator, batch_size):
    return torch.randn(batch_size, 8, generator=generator), torch.randn(batch_size, 2, generator=generator)
'''

USER_TESTS = '''
from pathlib import Path

import torch
import torch.distributed as dist

from conformance.testing import assert_check, run_check

HERE = Path(__file__).parent


def summed(rank_ctx, value):
    t = torch.tensor([float(value * (rank_ctx.rank + 1))])
    dist.all_reduce(t)
    return t.item()


def test_all_reduce_on_two_ranks(ddp_world):
    assert [r.value for r in ddp_world.run(summed, 1)] == [3.0, 3.0]


def test_good_target_accumulates_correctly(ddp_session):
    record = assert_check(ddp_session, "gradient-equivalence", str(HERE / "good_target.py"))
    assert record.status == "passed"


def test_loss_scaled_by_world_size(ddp_session):
    assert_check(ddp_session, "gradient-equivalence", str(HERE / "scaled_target.py"))


def test_no_accumulation_skips(ddp_session):
    assert_check(ddp_session, "no-sync-equivalence", str(HERE / "joined_target.py"))


def test_broken_target(ddp_session):
    assert_check(ddp_session, "gradient-equivalence", str(HERE / "broken_target.py"))


def test_record_for_own_assertions(ddp_session):
    record = run_check(ddp_session, "rank-consistency", str(HERE / "good_target.py"))
    assert record.status == "passed" and "identical" in record.message
'''


def test_users_tests_with_the_plugins_fixtures(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        test_user=USER_TESTS,
        good_target=TARGET_HEAD + "def loss_fn(o, t):\n    return nn.functional.mse_loss(o, t)\n",
        scaled_target=TARGET_HEAD + "import torch.distributed as dist\n"
                                    "def loss_fn(o, t):\n    return nn.functional.mse_loss(o, t) * dist.get_world_size()\n",
        joined_target=TARGET_HEAD + "def loss_fn(o, t):\n    return nn.functional.mse_loss(o, t)\n"
                                    "def train_step(model, optimizer, microbatches, loss_fn):\n"
                                    "    x = torch.cat([m[0] for m in microbatches]); y = torch.cat([m[1] for m in microbatches])\n"
                                    "    optimizer.zero_grad(); loss_fn(model(x), y).backward(); optimizer.step()\n",
        broken_target=TARGET_HEAD + "def loss_fn(o, t):\n    return nn.functional.mse_loss(o, t, reduce_it=True)\n",
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs", "--ddp-backend", "gloo",
                                           "--ddp-world-size", "2", "--ddp-deadline", "60", timeout=300)
    result.assert_outcomes(passed=3, failed=2, skipped=1)
    result.stdout.fnmatch_lines([
        "*test_loss_scaled_by_world_size*",
        "*gradient-equivalence failed on *scaled_target.py: *world size*",
    ], consecutive=False)
    result.stdout.fnmatch_lines([
        "*target error: target 'broken_target': loss_fn raised TypeError: *unexpected keyword argument "
        "'reduce_it' at broken_target.py:10; fix it in your target (see the README section 'Writing a target')",
    ])
    assert "During handling" not in result.stdout.str()
    result.stdout.fnmatch_lines(["SKIPPED*no-sync-equivalence: train_step does no accumulation*"])
