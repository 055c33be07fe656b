"""``batch_dim``: a target declares on which dimension make_batch's tensors hold the batch (one
int, or the structure of (inputs, targets) with an int or None per tensor). The suite then
splits every tensor on its own dimension (ranks, microbatches, the twin, the probes), passes a
None tensor whole, identifies samples by content along it; a declaration that does not fit
is a target error in one line. A time-major LSTM LM (tests/targets/time_major_lstm.py, tied
weights) passes the equivalence checks; without the declaration it is refused with the
measured hint; with a loss not divided by K it is caught with that cause."""

from __future__ import annotations

import pytest
import torch

from conformance.checks.sampling import read_epoch
from conformance.harness.batches import first_dim, take_rows
from conformance.harness.sharding import shard
from conformance.harness.targets import TargetError, load_target, make_batch_checked

from ..checks._check_helpers import run_check, target_spec

B = 8


def _time_major() -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
    tokens = torch.arange(5 * B).reshape(5, B)  # (T, B): column b is sample b
    hidden = torch.arange(2 * B).reshape(2, B, 1).float()  # (layers, B, H)
    return (tokens, hidden), tokens + 100


def test_every_tensor_is_split_on_its_declared_dimension():
    micro = shard(_time_major(), 1, 2, 2, dims=1)  # rank 1 of 2: samples 4..7, two microbatches
    (tokens, hidden), targets = micro[1]
    assert tokens[0].tolist() == [6, 7] and hidden[:, :, 0].tolist() == [[6, 7], [14, 15]]
    assert targets[0].tolist() == [106, 107]
    # A structure: per tensor, None passed whole to every microbatch.
    mask = torch.ones(3, 3)
    (tokens, whole), _ = shard(((_time_major()[0][0], mask), torch.arange(B)), 0, 2, dims=((1, None), 0))[0]
    assert tokens.shape == (5, 4) and whole is mask
    assert take_rows({"x": torch.zeros(2, B)}, 0, 3, {"x": 1})["x"].shape == (2, 3)
    assert take_rows(torch.arange(2 * B).reshape(2, B), 6, 8, -1).tolist() == [[6, 7], [14, 15]]
    # A model's own inputs (resume's and eval's row counts) take the first declared batched dim.
    assert (first_dim(None), first_dim(((None, None), 1)), first_dim(({"m": None, "x": 2}, 0))) == (0, 1, 2)


def _target(tmp_path, declaration: str, batch: str = "(tokens, hidden), tokens"):
    path = tmp_path / "declared.py"
    path.write_text("import torch\nfrom conformance.targets.mlp import build_model, loss_fn  # noqa: F401\n"
                    f"{declaration}\n"
                    "def make_batch(generator, batch_size):\n"
                    "    tokens = torch.zeros(5, batch_size)\n"
                    "    hidden = torch.zeros(2, batch_size, 3)\n"
                    f"    return {batch}\n")
    return load_target(str(path))


@pytest.mark.parametrize("declaration, said", [
    ("batch_dim = 'time'", r"batch_dim = 'time' is not an int, None, or a tuple/list/dict of them; "
                           r"declare one int for every tensor, or the structure of make_batch's \(inputs, targets\)"),
    ("batch_dim = (1, (1, True))", r"batch_dim = \(1, \(1, True\)\) holds True, which is not an int"),
    ("batch_dim = (1, 1, 1)", r"batch_dim = \(1, 1, 1\) does not have the shape of make_batch's return, "
                              r"a pair \(inputs, targets\)"),
])
def test_a_declaration_that_is_no_layout_is_refused_at_load(tmp_path, declaration, said):
    with pytest.raises(TargetError, match=said + r".*see the README section 'Writing a target'"):
        _target(tmp_path, declaration)


@pytest.mark.parametrize("declaration, said", [
    # Undeclared, a time-major batch: the hint is what was measured (dim 1 has the batch size).
    ("", r"returned inputs with a tensor of shape \(5, 8\); dim 0 of every tensor must be the batch "
         r"size 8; its dim 1 has size 8: if the batch is on dim 1 \(time-major\), declare batch_dim = 1"),
    ("batch_dim = 2", r"returned inputs\[0\] of shape \(5, 8\), but batch_dim declares dim 2 for it, which "
                      r"it does not have \(its dim 1 has size 8: declare batch_dim = 1 if that is the batch\)"),
    ("batch_dim = ((1, 0), 1)", r"returned inputs\[1\] of shape \(2, 8, 3\), but batch_dim declares dim 0 "
                                r"for it, of size 2, not the batch size 8 \(its dim 1"),
    ("batch_dim = ((1, 1, 1), 1)", r"returned what batch_dim = \(\(1, 1, 1\), 1\) does not match: inputs is a "
                                   r"tuple of 2 but batch_dim gives a tuple of 3 there"),
    ("batch_dim = (None, None)", r"returned no tensor that batch_dim = \(None, None\) declares batched"),
])
def test_a_declaration_that_does_not_fit_the_batch_is_refused(tmp_path, declaration, said):
    target = _target(tmp_path, declaration)
    with pytest.raises(TargetError, match=r"make_batch\(generator, 8\) " + said):
        make_batch_checked(target, torch.Generator().manual_seed(0), B)


def test_samples_are_identified_by_content_along_the_declared_dimension():
    def epoch_batches(rank, world_size, epoch):
        yield _time_major()

    declared, _ = read_epoch(epoch_batches, 0, 1, 0, identity="content", dims=1)
    undeclared, _ = read_epoch(epoch_batches, 0, 1, 0, identity="content")
    assert len(set(declared.ids)) == B and len(undeclared.ids) == 5  # samples, not time steps


@pytest.mark.parametrize("check_id", ["gradient-equivalence", "no-sync-equivalence"])
def test_a_time_major_lstm_passes_the_equivalence_checks(suite_session, check_id):
    record = run_check(suite_session, check_id, "time_major_lstm")
    assert record.status == "passed", record.message
    assert record.metrics["max_abs_grad_diff"] < 1e-6


def test_a_time_major_loss_not_divided_by_k_is_named(suite_session):
    record = run_check(suite_session, "no-sync-equivalence", "time_major_lstm_k_not_divided")
    assert record.status == "failed"
    assert "the loss is not divided by the K=4 accumulation steps" in record.message


def test_a_flattened_time_major_target_is_told_by_its_sizes(tmp_path):
    # word_language_model's get_batch flattens its (T, B) target with view(-1) for NLLLoss.
    target = _target(tmp_path, "batch_dim = 1", batch="(tokens, hidden), tokens.reshape(-1)")
    with pytest.raises(TargetError, match=r"returned targets of shape \(40,\), but batch_dim declares dim 1 for "
                                          r"it, which it does not have \(its 40 elements are 5 × the batch size 8: "
                                          r"if it is a \(T, B\) tensor flattened, return it unflattened"):
        make_batch_checked(target, torch.Generator().manual_seed(0), B)


def test_the_lstm_without_its_declaration_is_told_to_declare_it():
    # Through the edge every run passes first (the CLI's validation child calls the same
    # make_batch_checked, exit 2): measured, dim 1 of the (T, B) tokens has the batch size.
    target = load_target(target_spec("time_major_lstm_undeclared"))
    with pytest.raises(TargetError, match=r"make_batch\(generator, 16\) returned inputs with a tensor of shape "
                                          r"\(5, 16\); dim 0 of every tensor must be the batch size 16; its dim 1 "
                                          r"has size 16: if the batch is on dim 1 \(time-major\), declare batch_dim = 1"):
        make_batch_checked(target, torch.Generator().manual_seed(0), target.batch_size_for(2))
