"""BROKEN: the BatchNorm net with ``broadcast_buffers=False``: each rank's running statistics
follow its own data shard and drift apart. rank-consistency must name the first diverging
buffer (a BatchNorm running_mean/var), its rank and step.

    ddp-conformance run --target tests/targets/bn_no_broadcast.py --checks rank-consistency
"""

from __future__ import annotations

from conformance.targets.convbn import build_model, loss_fn, make_batch  # noqa: F401

ddp_kwargs = {"find_unused_parameters": False, "broadcast_buffers": False}  # the bug
