"""Every time limit of the suite, each with the reason for its value.

The rule that ties them together: a timeout *inside* the world (the process group's, a
monitored barrier's) must fire before the supervisor's deadline, so that a blocked rank
reports its own error — with the collective it was stuck in — instead of being killed
silently. Import-light: plain numbers only.
"""

from __future__ import annotations

#: Seconds one distributed call (one check's work on every rank) may take before the
#: supervisor declares a hang. The CLI's ``--deadline`` and pytest's ``--ddp-deadline``
#: default. Long enough for a first NCCL communicator and a cold CUDA context on a GPU node
#: (tens of seconds), short enough that a hung CI job fails in minutes, not in gloo's 30.
DEFAULT_DEADLINE_S = 60.0

#: The process-group timeout of a world, as a share of its deadline: a collective blocked on
#: a live peer raises inside the rank (naming itself) with time to spare before the supervisor
#: kills it at the deadline.
PG_TIMEOUT_SHARE = 0.8
#: ...but never below one second: gloo rounds shorter timeouts up and a loaded CI host can take
#: that long to schedule a rank at all.
MIN_PG_TIMEOUT_S = 1.0


def pg_timeout_for(deadline: float) -> float:
    """The process-group timeout of a world whose calls have ``deadline`` seconds."""
    return max(deadline * PG_TIMEOUT_SHARE, MIN_PG_TIMEOUT_S)
