"""The scaling-cliff engine: the target's own DDP step behind a shaped link, held to the
simulator (docs/ddp-background.md, "Scaling cliffs"; docs/scaling-cliff.md).

On every rank at one link rate (``rank.link_point``): an all-reduce sweep, then DDP steps,
each after a plain pass that times each gradient's readiness, the ranks lined up by a shared
file (``host_barrier``), not over the shaped link. In the supervisor: a token-bucket link in
the simulator's terms (``shaped_link``), one rate's fit and prediction, the knee and the
sweep's report (``model``), the bucket layout proposed at the knee and re-run side by side
(``layout``), and the step projected onto the user's ``--link-gbps`` (``link_projection``).

The check entry (``conformance/perf/scaling_cliff.py``) imports this face, and ``model`` as a
module (its report, knees and table)."""

from __future__ import annotations

from . import model
from .host_barrier import HostBarrier
from .layout import verify_layout
from .link_projection import LinkProjection, project_link
from .rank import link_point

__all__ = ["HostBarrier", "LinkProjection", "link_point", "model", "project_link", "verify_layout"]
