"""The suite's instruments are invisible to the user's code (``harness.observe.unseen``): a copy
of an instrumented module (``copy.deepcopy``, pickling, ``state_dict``) is the module as the user
built it, and a failure of the suite's own code is said as such, never as the user's DDP step."""

from __future__ import annotations

import copy
import pickle

import torch

from conformance.harness.failures import suite_raised, world_error_outcome
from conformance.harness.observe import Forwards, unseen
from conformance.harness.world import RankError, RankFailure, RankResult


class _Holder:
    """A probe-like object a copy must never reach (it refuses to be copied)."""

    def __deepcopy__(self, memo):  # type: ignore[no-untyped-def]
        raise AssertionError("the probe was deep-copied with the module")

    def __reduce__(self):  # type: ignore[no-untyped-def]
        raise AssertionError("the probe was pickled with the module")


def test_a_copied_module_leaves_the_probes_hooks_behind():
    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    holder, seen = _Holder(), []

    def hook(module, args):  # type: ignore[no-untyped-def]
        seen.append((holder, module))

    model.register_forward_pre_hook(unseen(hook))
    forwards = Forwards(inner=model)
    import contextlib

    with contextlib.ExitStack() as stack:
        forwards.attach(stack)
        for clone in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
            clone(torch.zeros(1, 3))
        assert seen == [] and forwards.inner == 0  # the copies' forwards are not the model's
        model(torch.zeros(1, 3))
        assert len(seen) == 1 and seen[0][1] is model and forwards.inner == 1
    assert set(model.state_dict()) == {"0.weight", "0.bias"}


def test_an_ema_built_by_deep_copy_at_the_first_step_passes(suite_session):
    from tests.checks._check_helpers import run_check

    # timm's ModelEma(copy.deepcopy(model)), built lazily in train_step, and the model pickled.
    # Before: "the DDP training step raised on rank 0: raised AttributeError: 'Sequential'
    # object has no attribute '_parameters'" (a probe's bound hook copied with the DDP wrapper).
    record = run_check(suite_session, "gradient-equivalence", "ema_deepcopy")
    assert record.status == "passed", record.message


_TRACE = '''Traceback (most recent call last):
  File "{suite}/checks/equivalence/recording.py", line 500, in run_recorded
  File "/home/user/train.py", line 3, in train_step
  File "/usr/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1, in _call_impl
  File "{suite}/harness/observe/forwards.py", line 70, in _on_inner
KeyError: 3
'''


def test_the_suites_own_failure_is_inconclusive_and_names_the_suite_not_ddp():
    from pathlib import Path

    import conformance

    suite = str(Path(conformance.__file__).resolve().parent)
    trace = _TRACE.format(suite=suite)
    assert suite_raised(trace) == f"{suite}/harness/observe/forwards.py:70"
    # The user's code, or torch under the suite's frame (DDP refusing ddp_kwargs), is no suite fault.
    assert suite_raised(trace.replace(f"{suite}/harness/observe/forwards.py", "/home/user/model.py")) is None
    assert suite_raised(trace.rsplit(f'  File "{suite}/harness', 1)[0]) is None
    assert suite_raised(trace.replace("harness/observe/forwards.py", "targets/mlp.py")) is None
    # The suite calling the user's forward with arguments it does not take: raised at the call,
    # in the suite's frame, no user frame outside it — the user's signature, not a suite bug.
    assert suite_raised(f'  File "{suite}/harness/batches.py", line 177, in call\nTypeError: x') is None
    # The suite's hook called back by torch, under the suite's default train_step (no user frame
    # anywhere): an instrument of the suite's raised (seen on a sparse embedding gradient).
    hook = (f'  File "{suite}/harness/target_calls.py", line 9, in default_train_step\n'
            f'  File "/usr/lib/python3.11/site-packages/torch/optim/optimizer.py", line 5, in wrapper\n'
            f'  File "{suite}/checks/equivalence/recording.py", line 270, in _at_step\nRuntimeError: x')
    assert suite_raised(hook) == f"{suite}/checks/equivalence/recording.py:270"
    deeper = hook.replace("\nRuntimeError", f'\n  File "{suite}/checks/equivalence/wide_sums.py", line 66, in norm64'
                                            f"\nRuntimeError")
    assert suite_raised(deeper) == f"{suite}/checks/equivalence/wide_sums.py:66"
    error = RankError("exception", "3", traceback=trace, exc_type="KeyError")
    outcome = world_error_outcome(RankFailure("rank 0 raised", results=[RankResult(0, error=error)]),
                                  "the DDP training step")
    assert outcome.status == "inconclusive"
    assert outcome.message.startswith("the DDP training step could not be judged: the suite's own "
                                      f"instrumentation raised on rank 0 at {suite}/harness/observe/forwards.py:70")
    assert "a ddp-conformance bug, not a finding about your training step or DDP" in outcome.message


def test_a_long_exception_message_leaves_the_frames_in_the_evidence():
    from conformance.harness.failures import traceback_excerpt

    frames = "".join(f'  File "/home/user/f{i}.py", line {i}, in f{i}\n    call()\n    ^^^^^^\n' for i in range(40))
    message = "NotImplementedError: Could not run 'aten::linalg_vector_norm' " + "backend, " * 2000
    excerpt = traceback_excerpt("Traceback (most recent call last):\n" + frames + message)
    assert len(excerpt) <= 3000 + 10
    assert 'File "/home/user/f39.py", line 39' in excerpt  # the innermost frame kept
    assert "NotImplementedError: Could not run" in excerpt and excerpt.endswith("[...]")
    short = "Traceback (most recent call last):\n" + frames[:200] + "KeyError: 3\n"
    assert traceback_excerpt(short) == short
