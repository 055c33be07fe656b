"""The equivalence engine: an N-rank DDP run against its single-process reference.

The experiment (``experiment``: the reference on the 1-rank world writes its snapshots, the
N ranks compare against them where their tensors are, a twin measures the noise floor when a
difference needs it) runs the recorded step (``recording``: the target's own ``train_step``
under DDP, observed by rank-side instruments, ``instruments``) and gathers what it compared
(``comparison.Equivalence``); the diagnosis names measured causes only (``diagnosis``,
``hypotheses``); the verdict is the outcome every equivalence check shares (``verdict``), and
``presentation`` is how it reads in the record. Side paths: compiled targets (``compiled``),
comm hooks (``compression``), BatchNorm groups (``normalisation``), dropout and randomness
(``randomness``), top-k routing (``routing``), models that mix samples (``mixing``), ranks that cannot read the reference
(``digests``), and the known DDP errors whose remedies are re-run (``checkpointing``,
``buffers``). docs/architecture.md, "The equivalence engine".

Check entries import this face; so do the other checks that reuse its pieces (the per-tensor
comparison, snapshots, digests).
"""

from __future__ import annotations

from .checkpointing import name_known_cause
from .comparison import Equivalence
from .diagnosis import nonfinite
from .digests import DIGEST, REFERENCE, compared_by, first_divergence, named_digests, rank_view, who_sees
from .experiment import MICROBATCH_CHOICES, microbatches_for, run_equivalence
from .floor import MARGIN, smallest_bug
from .instruments import first_nonfinite
from .mixing import ADVICE as MIXING_ADVICE, Mixing, first_mixing, row_prints
from .normalisation import group_batchnorm
from .presentation import evidence, key_figure, metrics
from .randomness import disable_dropout
from .recording import RunPlan, run_recorded
from .snapshots import compare_snapshot, has_snapshot, read_snapshot, write_snapshot
from .tensors import Compared, TensorDiff, diff_tensor, fmt
from .verdict import RANDOM_FORWARD, judge
from .wide_sums import norm64, sum64

__all__ = [
    "DIGEST",
    "MARGIN",
    "MICROBATCH_CHOICES",
    "MIXING_ADVICE",
    "Mixing",
    "RANDOM_FORWARD",
    "REFERENCE",
    "Compared",
    "Equivalence",
    "RunPlan",
    "TensorDiff",
    "compare_snapshot",
    "compared_by",
    "diff_tensor",
    "disable_dropout",
    "evidence",
    "first_divergence",
    "first_mixing",
    "first_nonfinite",
    "fmt",
    "group_batchnorm",
    "has_snapshot",
    "read_snapshot",
    "judge",
    "key_figure",
    "metrics",
    "microbatches_for",
    "name_known_cause",
    "named_digests",
    "nonfinite",
    "rank_view",
    "row_prints",
    "smallest_bug",
    "norm64",
    "sum64",
    "run_equivalence",
    "run_recorded",
    "who_sees",
    "write_snapshot",
]
