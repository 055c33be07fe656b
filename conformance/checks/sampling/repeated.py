"""Repeated augmentation (DeiT's ``RASampler``) as ``sampler-coverage`` counts it: each sample
drawn r times per epoch by design, the r copies strided over the ranks (so up to ``ceil(r/N)``
on one rank), and an epoch of ``draws`` holding at least ``ceil(draws / r)`` distinct samples.
Its coverage is counted against the dataset's length: an epoch of a repeated-augmentation
sampler leaves most of the dataset for later epochs (DeiT selects ``len / N`` draws per rank,
so about ``len / r`` distinct samples), which the record says rather than "0 missing" of the
samples that happened to be drawn. Declared (``sampling = "repeated"``, ``sampling_repeats =
r``) or recognised from the sampler (an int ``num_repeats`` >= 2 on it)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Repetition:
    """Repeated augmentation (DeiT's RASampler): each sample drawn ``repeats`` times per epoch,
    the copies strided over the ranks, so up to ``ceil(r/N)`` land on one rank."""

    repeats: int
    #: "declared" (``sampling_repeats``) or the sampler's class whose ``num_repeats`` said it.
    source: str
    length: int | None  # the dataset's length, where the loader shows it
    across: Counter[Any]
    within: Counter[Any]

    def coverage(self, seen: Counter[Any]) -> dict[str, Any]:
        """An epoch's coverage counted against the dataset: its r-fold draws hold at least
        ``ceil(draws / r)`` distinct samples; the rest of the dataset is for other epochs."""
        draws, distinct = sum(seen.values()), len(seen)
        due = -(-draws // self.repeats)
        return {"dataset_length": self.length, "distinct_due": due, "short_of_repetition": max(0, due - distinct),
                "not_drawn_this_epoch": None if self.length is None else max(0, self.length - distinct)}

    def shortfall(self, epoch: int, record: dict[str, Any]) -> str:
        return (f"epoch {epoch}: {record['distinct']} distinct samples in {record['samples']} draws — with "
                f"each sample repeated {self.repeats} times ({self.source}) at least {record['distinct_due']} "
                f"were due: samples are drawn more often than the repetition makes")

    def to_json(self) -> dict[str, Any]:
        return {"repeats": self.repeats, "source": self.source, "dataset_length": self.length}


def repetition_of(declared: int | None, got: list[list[Any]], n: int, universe: set[Any]) -> Repetition | None:
    """The epoch's repetition: declared (``sampling_repeats``), else read from the sampler
    (an int ``num_repeats`` >= 2 on it, as DeiT's RASampler has), else None."""
    built = got[0][0].built if got and got[0] else {}
    found = built.get("num_repeats")
    repeats = declared if declared else found if isinstance(found, int) and found >= 2 else None
    if repeats is None:
        return None
    source = (f"sampling_repeats = {declared}" if declared
              else f"recognised from {built.get('sampler', 'the sampler')}.num_repeats = {found}")
    length = built.get("length")
    return Repetition(repeats, source, length if isinstance(length, int) else None,
                      Counter({i: repeats for i in universe}), Counter({i: -(-repeats // n) for i in universe}))
