"""examples/train_token_stream.py (llm.c's trainer shape): a stream read in order by design
passes sampler-coverage saying so, and ZeroRedundancyOptimizer passes rank-consistency's
mid-run look (taken where the user's optimizer.step() returns, not inside ZeRO's step).
Its bug variants: a shuffled order that repeats every epoch, and llm.c's end-of-shard test on
the whole step's stride (rank 1 wraps to the start within an epoch), each named."""

from __future__ import annotations

import pytest

from conformance.harness.registry import BY_ID

from ._variants import EXAMPLES, variant

EXAMPLE = str(EXAMPLES / "train_token_stream.py")


def test_sequential_stream_passes_saying_so(suite_session):
    record, _ = suite_session.run_check(BY_ID["sampler-coverage"], EXAMPLE)
    assert record.status == "passed", record.message
    assert "sequential order, no shuffling" in record.message
    assert record.metrics["epochs_with_repeated_order"] == [1, 2]


def test_zero_redundancy_optimizer_is_not_mid_run_drift(suite_session):
    record, _ = suite_session.run_check(BY_ID["rank-consistency"], EXAMPLE)
    assert record.status == "passed", record.message
    assert "run_loop: parameters bit-identical across ranks at 5 checkpoints" in record.message


@pytest.mark.parametrize("name, edits, needle", [
    ("shuffled_then_repeating",
     [("    for _ in range(loader.batches_per_epoch()):\n        *_, first = loader.next_batch()\n"
       "        yield list(range(first, first + ARGS.batch_size))\n",
       "    order = torch.randperm(ARGS.stream_windows, generator=torch.Generator().manual_seed(0))\n"
       "    mine = order[rank::world_size].tolist()  # BUG: the shuffle is seeded without the epoch\n"
       "    for b in range(0, len(mine) - ARGS.batch_size + 1, ARGS.batch_size):\n"
       "        yield mine[b:b + ARGS.batch_size]\n")],
     "the order is shuffled ("),
    ("reset_on_the_whole_stride",
     [("        if self.current_position + B * T + 1 > len(self.tokens):\n",
       "        if self.current_position + B * T * self.num_processes + 1 > len(self.tokens):  # BUG\n")],
     "rank 1 reads its samples in order and wraps to the start before the epoch ends"),
])
def test_stream_bugs_are_named(suite_session, tmp_path, name, edits, needle):
    record, _ = suite_session.run_check(BY_ID["sampler-coverage"], variant(tmp_path, "train_token_stream.py", name, *edits))
    assert record.status == "failed", record.message
    assert needle in record.message
