"""Correct target whose stream is cut into columns and read window by window (the word-level
LM example's ``batchify``): each batch holds window w of every column of this rank, samples
numbered column by column (``c · windows + w``), so the indices are not ascending sample by
sample, only batch by batch. Read in order by design: sampler-coverage must pass, saying
"sequential order, no shuffling".

    ddp-conformance run --target tests/targets/sampler_stream_columns.py --checks sampler-coverage
"""

from __future__ import annotations

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

COLUMNS, WINDOWS = 8, 12
sample_identity = "index"


def epoch_batches(rank: int, world_size: int, epoch: int):  # type: ignore[no-untyped-def]
    per_rank = COLUMNS // world_size
    mine = range(rank * per_rank, (rank + 1) * per_rank)
    for w in range(WINDOWS):
        yield [c * WINDOWS + w for c in mine]
