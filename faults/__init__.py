"""Faults (nemeses) and the chaos checks: deterministic injections, recorded and counted.

Import-light: the fault dataclasses and judges import no torch; vehicles, scenarios and the
checks import it when a world runs them.
"""

from __future__ import annotations

from .diagnosis import (
    HangDiagnosis,
    RankState,
    StragglerVerdict,
    diagnose_hang,
    score_stragglers,
    unused_from_error,
)
from .injectors import (
    PHASES,
    BucketConfig,
    ConditionalBranch,
    DeadRank,
    Injection,
    SkipCollective,
    SlowRank,
    StalledRank,
    UnevenBatches,
)

__all__ = [
    "PHASES",
    "BucketConfig",
    "ConditionalBranch",
    "DeadRank",
    "HangDiagnosis",
    "Injection",
    "RankState",
    "SkipCollective",
    "SlowRank",
    "StalledRank",
    "StragglerVerdict",
    "UnevenBatches",
    "diagnose_hang",
    "score_stragglers",
    "unused_from_error",
]
