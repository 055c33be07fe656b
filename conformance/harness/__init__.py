"""The harness every check family stands on (docs/architecture.md).

- :mod:`.registry` — every check id and where its code lives (the one documented inversion:
  ``"module:function"`` strings, imported only when a check runs);
- :mod:`.world` — supervised rank processes (``World``) and attach mode;
- :mod:`.session`, :mod:`.context`, :mod:`.outcome` — running one check into one record;
- :mod:`.failures` — the outcome of a world that raised or hung under any check;
- :mod:`.targets` — loading and validating what is checked;
- :mod:`.rank_run` — a check's rank side, from the target's spec to the trained model;
- :mod:`.ddp` — the one rank-side DDP module (seeds, wrap, device sync, timing);
- :mod:`.sharding` — the seeded global batch and each rank's share of it;
- :mod:`.observe` — the rank side's one way to watch the user's code (the ``Probe`` contract,
  its driver, the shared probes).

Import-light: nothing imported here imports torch.
"""

from __future__ import annotations

from .context import CheckContext
from .outcome import Outcome
from .registry import BY_ID, CHECKS, SUITES, CheckSpec, select
from .targets import BUILTINS, Target, TargetError, load_target

__all__ = [
    "BUILTINS",
    "BY_ID",
    "CHECKS",
    "SUITES",
    "CheckContext",
    "CheckSpec",
    "Outcome",
    "Target",
    "TargetError",
    "load_target",
    "select",
]
