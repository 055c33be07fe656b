"""harness.batches: a batch part may be a tensor or a tuple/list/dict of tensors; every tensor is
sliced alike, the structure kept, non-tensors passed through; the model is called the way Python
unpacks the inputs; a part without a tensor or with a tensor of the wrong batch size is refused
in one line. A dict-input target passes the equivalence checks through model(**inputs)."""

from __future__ import annotations

import pytest
import torch

from conformance.harness.batches import call_model, rows, take_rows
from conformance.harness.sharding import shard
from conformance.harness.targets import TargetError, load_target, make_batch_checked

from ..checks._check_helpers import run_check, target_spec


def test_every_tensor_is_sliced_alike_and_the_structure_kept():
    inputs = ({"a": torch.arange(8).reshape(4, 2), "b": None}, torch.arange(4))
    part = take_rows(inputs, 1, 3)
    assert rows(inputs) == 4 and part[0]["b"] is None
    assert part[0]["a"].tolist() == [[2, 3], [4, 5]] and part[1].tolist() == [1, 2]
    (mine, targets), = shard(((torch.arange(4), torch.arange(4) * 10), torch.arange(4)), 1, 2)
    assert [t.tolist() for t in mine] == [[2, 3], [20, 30]] and targets.tolist() == [2, 3]


def test_the_model_is_called_the_way_python_unpacks():
    def model(*args, **kwargs):
        return args, kwargs

    x = torch.zeros(1)
    assert call_model(model, x) == ((x,), {})
    assert call_model(model, (x, x)) == ((x, x), {})
    assert call_model(model, {"ids": x}) == ((), {"ids": x})


def test_a_tensor_of_the_wrong_batch_size_is_refused(tmp_path):
    path = tmp_path / "short_mask.py"
    path.write_text("import torch\nfrom conformance.targets.mlp import build_model, loss_fn  # noqa: F401\n"
                    "def make_batch(generator, batch_size):\n"
                    "    return (torch.zeros(batch_size, 16), torch.zeros(batch_size - 1, 16)), torch.zeros(batch_size, 4)\n")
    target = load_target(str(path))
    with pytest.raises(TargetError, match=r"returned inputs with a tensor of shape \(7, 16\); dim 0 of every "
                                          r"tensor must be the batch size 8"):
        make_batch_checked(target, torch.Generator().manual_seed(0), 8)


@pytest.mark.parametrize("check_id", ["gradient-equivalence", "no-sync-equivalence"])
def test_dict_inputs_pass_the_equivalence_checks(suite_session, check_id):
    record = run_check(suite_session, check_id, "dict_inputs")
    assert record.status == "passed", record.message
    assert target_spec("dict_inputs").endswith("dict_inputs.py")
