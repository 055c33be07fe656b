"""Faults (nemeses) and the chaos checks: deterministic injections, recorded and counted.

A fault is data with its schedule (``fires``) and its effect (``inject(site)``, at the
:class:`Site` a rank's loop offers); each injection that fires becomes one :class:`Injection`,
the record that travels to the report as a ``reports.schema.Event``.

Import-light: the faults, sites, records and judges import no torch; vehicles, scenarios and
the checks import it when a world runs them.
"""

from __future__ import annotations

from ._log import Injection, InjectionLog, read_injections, record_injections
from .diagnosis import (
    HangDiagnosis,
    RankState,
    StragglerVerdict,
    diagnose_hang,
    score_stragglers,
    unused_from_error,
)
from .injectors import (
    BucketConfig,
    ConditionalBranch,
    DeadRank,
    SkipCollective,
    SlowLink,
    SlowPair,
    SlowRank,
    StalledRank,
    UnevenBatches,
)
from .sites import PHASES, SITE_KINDS, Fault, Site

__all__ = [
    "PHASES",
    "SITE_KINDS",
    "BucketConfig",
    "ConditionalBranch",
    "DeadRank",
    "Fault",
    "HangDiagnosis",
    "Injection",
    "InjectionLog",
    "RankState",
    "Site",
    "SkipCollective",
    "SlowLink",
    "SlowPair",
    "SlowRank",
    "StalledRank",
    "StragglerVerdict",
    "UnevenBatches",
    "diagnose_hang",
    "score_stragglers",
    "read_injections",
    "record_injections",
    "unused_from_error",
]
