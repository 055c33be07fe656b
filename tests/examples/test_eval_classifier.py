"""examples/eval_classifier.py and its bug variants under eval-equivalence.

The correct evaluation passes and says what it compared (through the check's entry: a fresh
2-rank world, the session's 1-rank world for the reference); each variant is the example with one
classic bug of N-rank evaluation, caught with its measured cause. 51 eval samples on 2 ranks
(26 + 25). The variants share one fresh world with the check's short process-group timeout
(none of them hangs it: an uneven gather is stopped before it is issued), judged by the same
``verdict`` the entry calls."""

from __future__ import annotations

import contextlib
import re

import pytest

from conformance.checks.evaluation import evaluate_on_rank, failed_world, verdict
from conformance.harness.registry import BY_ID
from conformance.harness.timing import EVAL_PG_TIMEOUT_S
from conformance.harness.world import RankFailure

from ._variants import EXAMPLES, variant

CHECK = BY_ID["eval-equivalence"]

PADDED = ("    return list(range(ctx.rank, len(EVAL_SET), ctx.world_size))",
          "    from torch.utils.data import DistributedSampler\n"
          "    return DistributedSampler(EVAL_SET, num_replicas=ctx.world_size, rank=ctx.rank, shuffle=False)")
MEAN_OF_MEANS = ("    totals = torch.stack([losses.sum(), hits.sum(), torch.tensor(float(hits.numel()), dtype=torch.float64)])\n"
                 "    totals = totals.to(ctx.device)\n"
                 "    dist.all_reduce(totals)  # SUM over ranks: every rank then logs the same numbers\n"
                 "    loss_sum, correct, count = totals.tolist()\n"
                 "    return {\"loss\": loss_sum / count, \"accuracy\": correct / count}",
                 "    means = torch.stack([losses.mean(), hits.mean()]).to(ctx.device)\n"
                 "    dist.all_reduce(means)\n"
                 "    loss, accuracy = (means / ctx.world_size).tolist()\n"
                 "    return {\"loss\": loss, \"accuracy\": accuracy}")
UNREDUCED = ("    dist.all_reduce(totals)  # SUM over ranks: every rank then logs the same numbers\n", "")
TRAIN_MODE = ("    model.eval()\n", "")
WITH_AUTOGRAD = ("    with torch.no_grad():\n", "    if True:  # no torch.no_grad()\n")
RANK0_ONLY = ("    loader = DataLoader(", "    if ctx.rank != 0:\n        return {}\n    loader = DataLoader(")
UNEVEN_GATHER = (MEAN_OF_MEANS[0],
                 "    gathered = [torch.empty_like(hits) for _ in range(ctx.world_size)]\n"
                 "    dist.all_gather(gathered, hits)\n"
                 "    return {\"accuracy\": float(torch.cat(gathered).mean())}")

#: case -> (edits, regex the message must match: the measured cause)
CASES = {
    "padding_counted": ([PADDED], r"metric '(loss|accuracy)' on 2 ranks is .* — cause: padding duplicates: "
                                  r"51 samples on 2 ranks: DistributedSampler pads to 52, sample 0 counted twice"),
    "mean_of_means": ([MEAN_OF_MEANS], r"— cause: mean of per-rank means over uneven shards: rank 0 \S+ over 26 "
                                       r"samples, rank 1 \S+ over 25 samples averaged unweighted to \S+; weighted by "
                                       r"the samples they are \S+, the 1-rank value"),
    "rank0_unreduced": ([UNREDUCED], r"metric '(loss|accuracy)' differs across ranks .* — cause: no reduction: each "
                                     r"rank reports its own shard's value .*weighted by the samples they are \S+, the "
                                     r"1-rank value, and evaluate called no collective"),
    "train_mode_left_on": ([TRAIN_MODE], r"— cause: model in train mode during evaluate: '1', '3' in train mode at "
                                         r"the forward; buffers updated by the eval set: 1\.num_batches_tracked, "
                                         r"1\.running_mean, 1\.running_var"),
    # The metrics agree (autograd changes no value): the forward with autograd on is the finding.
    "autograd_on": ([WITH_AUTOGRAD], r"^the forward ran with autograd on during evaluate \(rank 0 2 of 2 forwards, "
                                     r"rank 1 2 of 2 forwards\)$"),
    "uneven_all_gather": ([UNEVEN_GATHER], r"^evaluate's all_gather \(collective #0\) of tensors of different shapes: "
                                           r"rank 0 \[26\], rank 1 \[25\] — culprit rank 1"),
    # Last: DDP's buffer broadcast in rank 0's eval forward meets rank 1's training step, and gloo
    # aborts a process on the mismatch (the world restarts for whatever runs next).
    "rank0_only": ([RANK0_ONLY], r"^only some ranks evaluated: rank\(s\) \[1\] returned from evaluate after 0 "
                                 r"forwards and went on into the training step, while rank 0 died"),
}


def test_correct_evaluation_passes_and_says_what_it_compared(suite_session):
    record, _ = suite_session.run_check(CHECK, str(EXAMPLES / "eval_classifier.py"))
    assert record.status == "passed", record.message
    assert re.search(r"^2 metric\(s\) \(loss, accuracy\) on 2 ranks equal the 1-rank run within tolerance .* and "
                     r"on every rank; 51 samples \(26\+25 per rank, by index\) against 51 on 1 rank; eval mode, no "
                     r"autograd and 3 buffer\(s\) unchanged on every rank over 4 forwards; a training step after "
                     r"evaluate ran$",
                     record.message), record.message
    samples = record.evidence["samples"]
    assert samples["duplicates"] == {} and samples["missing"] == [] and samples["per_rank"] == {"0": 26, "1": 25}
    assert record.evidence["collectives"] == {"0": ["all_reduce(SUM)"], "1": ["all_reduce(SUM)"]}


def test_target_without_evaluate_skips_with_the_reason(suite_session):
    record, _ = suite_session.run_check(CHECK, "mlp")
    assert record.status == "skipped"
    assert record.message.startswith("target 'mlp' defines no evaluate(model, ctx): no distributed evaluation")


@pytest.fixture(scope="module")
def eval_world(suite_session):
    with contextlib.closing(suite_session.new_world(pg_timeout=EVAL_PG_TIMEOUT_S)) as world:
        yield world


@pytest.mark.parametrize("case", list(CASES))
def test_bug_variant_fails_with_its_cause(suite_session, eval_world, tmp_path, case):
    edits, cause = CASES[case]
    spec = variant(tmp_path, "eval_classifier.py", case, *edits)
    reference = suite_session.world(world_size=1).run(evaluate_on_rank, spec, train_after=False)[0].value
    try:
        ranks = [r.value for r in eval_world.run(evaluate_on_rank, spec, train_after=True)]
    except RankFailure as exc:  # as the check's entry does
        outcome = failed_world(exc.results, {r.rank: r.error.describe() for r in exc.results if r.error})
    else:
        outcome = verdict(ranks, reference)
    assert outcome.status == "failed", outcome.message
    assert re.search(cause, outcome.message), outcome.message
    assert "no known cause matched" not in outcome.message
