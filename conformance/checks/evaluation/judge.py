"""The supervisor side: the N ranks' records against the 1-rank reference's, and the causes.

Every cause named here is a hypothesis tested on the records (the tolerance: docs/numerics.md,
"Evaluation metrics"):

- padding duplicates: indices fetched more often on N ranks than in the 1-rank run, with the
  DistributedSampler's arithmetic (dataset length, replicas, padded total);
- mean of per-rank means: the shards differ in length, and an all-reduced input of every rank,
  averaged without weights, is the reported value while weighted by the shard sizes it is the
  1-rank value;
- no reduction: the ranks report different values (each its own shard's), with no collective
  called or with their sample-weighted mean equal to the 1-rank value;
- train mode: modules that behave differently in training (BatchNorm, Dropout) were in train
  mode at the forward, or buffers changed;
- an uneven gather, an evaluation on only some ranks, a training step that DDP's reducer
  refuses after an eval forward with autograd on.

Anything else is "no known cause matched", with the evidence.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ...harness.observe import SamplerSeen
from .observers import index_counts
from .records import EvalRank

#: float32's machine epsilon: evaluation sums are float32 (or float64) tensors.
EPS32 = 2.0 ** -23
#: Differences below this are equal whatever the scale of the metric (a metric that is 0).
ABS_FLOOR = 1e-12
#: DDP's reducer error when the previous forward prepared a reduction that no backward finished.
REDUCER_ERROR = "Expected to have finished reduction in the prior iteration"


def tolerance(reference: float, samples: int) -> float:
    """How far an N-rank metric may be from the 1-rank one: sqrt(n) float32 epsilons of it.

    Measured (docs/numerics.md): the same per-sample values summed per rank over strided
    shards, then across 2, 3 or 8 ranks, differ from the one sum by at most 2.2e-7, 4.9e-7,
    2.5e-6, 8.5e-6 relative for 51, 1e3, 5e4, 1e6 samples, and the batch composition of a
    float32 forward by ~1 epsilon; sqrt(n)·eps is 4-14 times those. One duplicated or missing
    sample moves a mean by ~1/n of its spread, far above it.
    """
    return math.sqrt(max(samples, 1)) * EPS32 * abs(reference) + ABS_FLOOR


@dataclass(frozen=True)
class Coverage:
    """Samples counted on N ranks against the 1-rank run (by index where loaders had one)."""

    by: str  # "index" | "rows"
    expected: int  # samples of the 1-rank run
    seen: int  # over the N ranks
    per_rank: dict[int, int]
    duplicates: dict[int, int]  # index -> times seen, where above the 1-rank count
    missing: tuple[int, ...]
    sampler: SamplerSeen | None

    def as_dict(self) -> dict[str, Any]:
        return {"by": self.by, "expected": self.expected, "seen": self.seen,
                "per_rank": {str(r): n for r, n in self.per_rank.items()},
                "duplicates": {str(i): n for i, n in list(self.duplicates.items())[:20]},
                "missing": list(self.missing[:20]),
                "sampler": None if self.sampler is None else {
                    "dataset_len": self.sampler.dataset_len, "num_replicas": self.sampler.num_replicas,
                    "total_size": self.sampler.total_size, "drop_last": self.sampler.drop_last}}


def coverage(ranks: list[EvalRank], reference: EvalRank) -> Coverage:
    ref = index_counts([reference.samples])
    seen = index_counts([r.samples for r in ranks])
    # Indices are comparable only into the same datasets: ranks that each build their own
    # (a per-rank file shard) number their samples from 0, and are counted by rows instead.
    if ref and set(seen) == set(ref):
        dup: dict[int, int] = {}
        missing: list[int] = []
        for key, expected in ref.items():
            got = seen.get(key, Counter())
            dup.update({i: n for i, n in sorted(got.items()) if n > expected.get(i, 0)})
            missing += [i for i, n in sorted(expected.items()) if got.get(i, 0) < n]
        sampler = next((s for r in ranks for s in r.samples.samplers), None)
        return Coverage("index", sum(sum(c.values()) for c in ref.values()),
                        sum(sum(c.values()) for c in seen.values()),
                        {r.rank: sum(len(v) for v in r.samples.indices.values()) for r in ranks},
                        dup, tuple(missing), sampler)
    rows = {r.rank: r.forward.rows for r in ranks}
    return Coverage("rows", reference.forward.rows, sum(rows.values()), rows, {}, (), None)


def padding_text(cov: Coverage, world_size: int, *, verb: str = "counted") -> str:
    """"51 samples on 2 ranks: DistributedSampler pads to 52, sample 0 counted twice"."""
    times = {2: "twice", 3: "three times"}
    dups = ", ".join(f"sample {i} {verb} {times.get(n, f'{n} times')}" for i, n in list(cov.duplicates.items())[:5])
    more = f" (and {len(cov.duplicates) - 5} more)" if len(cov.duplicates) > 5 else ""
    s = cov.sampler
    if s is not None and s.total_size > s.dataset_len and not s.drop_last:
        return (f"{s.dataset_len} samples on {s.num_replicas} ranks: DistributedSampler pads to "
                f"{s.total_size}, {dups}{more}")
    return f"{cov.expected} samples on {world_size} ranks, {cov.seen} {verb}: {dups}{more}"


@dataclass(frozen=True)
class Comparison:
    """One metric: the 1-rank value, every rank's, and the tolerance."""

    metric: str
    reference: float | None
    per_rank: dict[int, float | None]
    tolerance: float

    @property
    def missing(self) -> list[str]:
        where = [f"rank {r}" for r, v in self.per_rank.items() if v is None]
        return where + (["the 1-rank run"] if self.reference is None else [])

    @property
    def ranks_agree(self) -> bool:
        values = [v for v in self.per_rank.values() if v is not None]
        return all(_close(v, values[0], self.tolerance) for v in values)

    @property
    def first(self) -> float | None:
        return next((v for v in self.per_rank.values() if v is not None), None)

    @property
    def equal(self) -> bool:
        return (not self.missing and self.ranks_agree and self.reference is not None
                and self.first is not None and _close(self.first, self.reference, self.tolerance))

    @property
    def max_diff(self) -> float:
        if self.reference is None:
            return math.inf
        return max((abs(v - self.reference) for v in self.per_rank.values() if v is not None), default=math.inf)

    def as_dict(self) -> dict[str, Any]:
        return {"reference": self.reference, "per_rank": {str(r): v for r, v in self.per_rank.items()},
                "tolerance": self.tolerance, "max_abs_diff": None if math.isinf(self.max_diff) else self.max_diff}


def _close(a: float, b: float, tol: float) -> bool:
    return a == b or abs(a - b) <= tol


def compare(ranks: list[EvalRank], reference: EvalRank, samples: int) -> list[Comparison]:
    ref = reference.metrics or {}
    names = list(dict.fromkeys([*ref, *(k for r in ranks for k in (r.metrics or {}))]))
    out = []
    for name in names:
        value = ref.get(name)
        tol = tolerance(value if value is not None and math.isfinite(value) else 0.0, samples)
        out.append(Comparison(name, value, {r.rank: (r.metrics or {}).get(name) for r in ranks}, tol))
    return out


@dataclass(frozen=True)
class Cause:
    name: str  # only-some-ranks | padding | missing | per-rank-set | mean-of-means | no-reduction | train-mode
    text: str


def _shard_sizes(ranks: list[EvalRank], cov: Coverage) -> dict[int, int]:
    return cov.per_rank if cov.by == "index" and any(cov.per_rank.values()) else {r.rank: r.forward.rows for r in ranks}


def mean_of_means(ranks: list[EvalRank], comp: Comparison, sizes: dict[int, int]) -> str | None:
    """An all-reduced value that, unweighted over the ranks, is what was reported and, weighted
    by the shard sizes, is the 1-rank value; only while the shards differ in length."""
    if len(set(sizes.values())) < 2 or comp.reference is None or comp.first is None:
        return None
    calls = [[c for c in r.collectives.calls if c.op == "all_reduce" and c.values_in] for r in ranks]
    total = sum(sizes.values())
    for index in range(min(len(c) for c in calls)):
        inputs = [c[index].values_in or () for c in calls]
        for pos in range(min(len(v) for v in inputs)):
            values = {r.rank: inputs[i][pos] for i, r in enumerate(ranks)}
            plain = sum(values.values()) / len(values)
            weighted = sum(sizes[r] * v for r, v in values.items()) / total
            if _close(plain, comp.first, comp.tolerance) and _close(weighted, comp.reference, comp.tolerance):
                per = ", ".join(f"rank {r} {v:.6g} over {sizes[r]} samples" for r, v in values.items())
                return (f"mean of per-rank means over uneven shards: {per} averaged unweighted to "
                        f"{plain:.6g}; weighted by the samples they are {weighted:.6g}, the 1-rank value")
    return None


def no_reduction(ranks: list[EvalRank], comp: Comparison, sizes: dict[int, int]) -> str | None:
    """The ranks report different values, each its own: no collective, or their sample-weighted
    mean is the 1-rank value."""
    values = {r: v for r, v in comp.per_rank.items() if v is not None}
    if comp.ranks_agree or len(values) < 2:
        return None
    per = ", ".join(f"rank {r} {v:.6g} over {sizes.get(r, 0)} samples" for r, v in values.items())
    silent = all(not r.collectives.calls for r in ranks)
    total = sum(sizes.get(r, 0) for r in values)
    weighted = sum(sizes.get(r, 0) * v for r, v in values.items()) / total if total else math.nan
    if comp.reference is not None and _close(weighted, comp.reference, comp.tolerance):
        return (f"no reduction: each rank reports its own shard's value ({per}); weighted by the samples "
                f"they are {weighted:.6g}, the 1-rank value" + (", and evaluate called no collective" if silent else ""))
    if silent:
        return f"no reduction: each rank reports its own value ({per}) and evaluate called no collective"
    return None


def per_rank_set(ranks: list[EvalRank], comp: Comparison, cov: Coverage) -> str | None:
    """Every rank forwarded as many rows as the 1-rank run: the evaluation takes a fixed number of
    batches *per rank* (build-nanogpt's ``val_loss_steps``, each rank reading from its own offset),
    so N ranks evaluate N times the data of one, and the metric moves with the world size. Only
    where samples are counted by rows (no dataset indices to tell sets apart) and the N-rank run
    forwarded more rows in all than the 1-rank run, and the ranks' own values differ (what each
    put into its first reduction carrying values, else what each reports): ranks that each
    evaluated the same whole set would agree there, and their fault would be the reduction."""
    if cov.by != "rows" or len(ranks) < 2 or not cov.expected:
        return None
    rows = {r.rank: r.forward.rows for r in ranks}
    if any(n != cov.expected for n in rows.values()):
        return None
    firsts = [next((c.values_in for c in r.collectives.calls if c.values_in), None) for r in ranks]
    own = firsts if all(v is not None for v in firsts) else list(comp.per_rank.values())
    if len(set(own)) < 2:
        return None
    return (f"the evaluated set grows with the world size: each of the {len(ranks)} ranks forwarded "
            f"{cov.expected} rows, as many as the 1-rank run, so {len(ranks)} ranks evaluated "
            f"{sum(rows.values())} rows against {cov.expected} (a fixed number of eval batches per rank, "
            f"each rank reading its own part of the data)")


def causes(ranks: list[EvalRank], comp: Comparison, cov: Coverage) -> list[Cause]:
    """What the records show about a metric that is not the 1-rank one (or not the same on
    every rank): each cause only where its measurement holds."""
    found = []
    forwards = {r.rank: r.forward.calls for r in ranks}
    if 0 in forwards.values() and any(forwards.values()):
        found.append(Cause("only-some-ranks", "only rank(s) " + str([r for r, n in forwards.items() if n])
                           + " evaluated (forwards per rank: "
                           + ", ".join(f"rank {r} {n}" for r, n in forwards.items()) + ")"))
    if cov.duplicates:
        found.append(Cause("padding", "padding duplicates: " + padding_text(cov, len(ranks))))
    if cov.missing:
        found.append(Cause("missing", f"{len(cov.missing)} of {cov.expected} samples never evaluated "
                                      f"(first: {', '.join(map(str, cov.missing[:5]))})"))
    grown = per_rank_set(ranks, comp, cov)
    if grown is not None:
        found.append(Cause("per-rank-set", grown))
    sizes = _shard_sizes(ranks, cov)
    for name, test in (("mean-of-means", mean_of_means), ("no-reduction", no_reduction)):
        text = test(ranks, comp, sizes)
        if text is not None:
            found.append(Cause(name, text))
    read = sorted({n for r in ranks if r.world_size > 1 for n in r.shard_reads})
    if read and comp.per_rank and len({v for v in comp.per_rank.values()}) > 1:
        # Measured: the ranks disagree, and evaluate's own code read their local shards.
        found.append(Cause("local-shards", f"evaluate read this rank's shard of {len(read)} FSDP2-sharded "
                                           f"parameter(s) ({', '.join(read[:4])}{' ...' if len(read) > 4 else ''}) "
                                           f"with to_local(): each of the {len(ranks)} ranks computed from "
                                           f"its own slice of the model, not the whole parameter"))
    modules = sorted({m for r in ranks for m in r.forward.train_mode_modules})
    changed = sorted({b for r in ranks for b in r.buffers.changed})
    if modules or changed:
        text = "model in train mode during evaluate"
        if modules:
            text += f": {', '.join(repr(m) for m in modules[:6])} in train mode at the forward"
        if changed:
            text += f"; buffers updated by the eval set: {', '.join(changed[:6])}"
        found.append(Cause("train-mode", text))
    return found


@dataclass(frozen=True)
class Hygiene:
    """What evaluate must leave alone: the mode, autograd, buffers, gradients, the next step."""

    train_mode: dict[int, tuple[str, ...]] = field(default_factory=dict)
    grad_enabled: dict[int, str] = field(default_factory=dict)  # rank -> "k of n forwards"
    buffers_changed: dict[int, tuple[str, ...]] = field(default_factory=dict)
    grads_written: dict[int, tuple[str, ...]] = field(default_factory=dict)
    step_errors: dict[int, str] = field(default_factory=dict)
    buffers_compared: int = 0  # per rank
    forwards: int = 0  # over the ranks

    def as_dict(self) -> dict[str, Any]:
        def keyed(d: dict[int, Any]) -> dict[str, Any]:
            return {str(k): list(v) if isinstance(v, tuple) else v for k, v in d.items()}

        return {"train_mode_modules": keyed(self.train_mode), "grad_enabled_forwards": keyed(self.grad_enabled),
                "buffers_changed": keyed(self.buffers_changed), "gradients_written": keyed(self.grads_written),
                "step_errors": keyed(self.step_errors), "buffers_compared": self.buffers_compared,
                "forwards": self.forwards}


def hygiene(ranks: list[EvalRank]) -> Hygiene:
    return Hygiene(
        {r.rank: r.forward.train_mode_modules for r in ranks if r.forward.train_mode_modules},
        {r.rank: f"{r.forward.grad_enabled_calls} of {r.forward.calls} forwards" for r in ranks
         if r.forward.grad_enabled_calls},
        {r.rank: r.buffers.changed for r in ranks if r.buffers.changed},
        {r.rank: r.forward.grads_written for r in ranks if r.forward.grads_written},
        {r.rank: r.step.error for r in ranks if r.step.error},
        max((r.buffers.compared for r in ranks), default=0), sum(r.forward.calls for r in ranks))
