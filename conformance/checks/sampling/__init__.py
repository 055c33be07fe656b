"""sampler-coverage's engine: what each rank's pipeline yields in an epoch (``pipeline``: the
target's ``epoch_batches`` read with a bound, sample identities, built contents) and what the
orders say (``order``: shuffled, sequential, with replacement, wrapped, the same built samples on
every rank); the judgement of every rank's epochs (``judge``), repeated augmentation counted as
such (``repeated``), and the training loop's own loaders watched (``loop``). The check entry is
``conformance/checks/sampler_coverage.py``."""

from __future__ import annotations

from .order import Order, order_of, repeats_within_rank, same_built, same_built_problem, wraps
from .pipeline import EpochNotEnding, RankEpoch, built_contents, read_epoch

__all__ = ["EpochNotEnding", "Order", "RankEpoch", "built_contents", "order_of", "read_epoch", "repeats_within_rank",
           "same_built", "same_built_problem", "wraps"]
