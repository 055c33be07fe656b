"""Whether the target's own work asked for its rank.

Node-health gives every rank the same input and the same weights, so the ranks must compute
the same bits. A forward that reads ``torch.distributed.get_rank()`` can still run other work
on every rank by design — MoCo's shuffle BN gathers the batch and encodes its rank's share of
a permutation (moco/builder.py) — and then the ranks differ with no fault anywhere. The call
sites are recorded while the forward and backward run, so the judge says so instead of
naming ranks to drain. Only calls through the ``torch.distributed`` attribute are seen (a
``get_rank`` imported by name before the run is not), and torch's own internal calls do not
go through it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from typing import Any

from conformance.harness.observe import collectives


@contextlib.contextmanager
def rank_reads(sites: list[str]) -> Iterator[None]:
    """For the block, every ``torch.distributed.get_rank()`` call appends its caller
    (``file:line in function``) to ``sites``: a tap of the collectives probe, the one patch of
    ``torch.distributed``."""

    def seen(called: collectives.Called, proceed: collectives.Proceed) -> Any:
        caller = sys._getframe(1)
        while caller.f_back is not None and caller.f_code.co_filename == collectives.__file__:
            caller = caller.f_back  # past the probe's dispatcher: the code that asked
        sites.append(f"{os.path.basename(caller.f_code.co_filename)}:{caller.f_lineno} in {caller.f_code.co_name}")
        return proceed()

    with contextlib.ExitStack() as stack:
        collectives.tap(stack, seen, ("get_rank",))
        yield
