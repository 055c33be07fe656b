"""The rank side's one way to watch the user's code (docs/architecture.md, "The rank side: probes").

- :mod:`.probe` — the ``Probe`` contract (attach on an ``ExitStack``, per-step slices, a typed
  result slice) and the ``Observation`` driver (a body once or per step, journaled per step
  when asked; the union of the slices);
- :mod:`.loader` — the loader-index probe (the one patch of torch's DataLoader iterator);
  :mod:`.loader_epochs` — its ``epochs`` reading: each epoch's whole order, replayed from a copy
  of the sampler;
- :mod:`.collectives` — the collectives probe (the one patch of ``torch.distributed``) and its taps;
- :mod:`.comm_rounds` — DDP's bucket all-reduces, counted inside its comm hook chain;
- :mod:`.forwards` — forwards through DDP and through the inner module, training or not;
- :mod:`.step_collectives` — the collectives the step calls in its forward, loss and
  ``autograd.Function`` backwards (a tap of the collectives probe);
- :mod:`.optimizer_steps` — every optimizer step (torch's global step hooks, ``GradScaler.step``);
- :mod:`.unseen` — the wrapper of every hook a probe puts on the user's module: a copy of the
  module (``copy.deepcopy``, pickling) leaves it behind.

A check family adds probes of its own against this contract; it never adds a second contract
or patches these functions again (``tests/test_architecture.py`` holds it). Import-light:
nothing imported here imports torch.
"""

from __future__ import annotations

from .collectives import (
    COLLECTIVES,
    AllReduceBytes,
    CallCounts,
    CallRecords,
    Called,
    CollectiveCall,
    CollectiveSlice,
    UnevenCollective,
    UnevenGather,
    tap,
)
from .comm_rounds import AllReduceSlice, CommRounds, counting_allreduce
from .forwards import OUTSIDE, TRAINING, ForwardCountSlice, Forwards, SyncFlags, SyncFlagSlice
from .loader import LoaderIndices, SamplerSeen, SamplesSlice
from .loader_epochs import LoaderEpoch
from .optimizer_steps import OptimizerSteps
from .probe import Counts, Observation, Probe, Slice, Step
from .step_collectives import StepCollective, StepCollectives, StepCollectivesSlice
from .unseen import Unseen, unseen

__all__ = [
    "COLLECTIVES",
    "OUTSIDE",
    "TRAINING",
    "AllReduceBytes",
    "AllReduceSlice",
    "CallCounts",
    "CallRecords",
    "Called",
    "CollectiveCall",
    "CollectiveSlice",
    "CommRounds",
    "Counts",
    "ForwardCountSlice",
    "Forwards",
    "LoaderEpoch",
    "LoaderIndices",
    "Observation",
    "OptimizerSteps",
    "Probe",
    "SamplerSeen",
    "SamplesSlice",
    "Slice",
    "Step",
    "StepCollective",
    "StepCollectives",
    "StepCollectivesSlice",
    "SyncFlagSlice",
    "SyncFlags",
    "UnevenCollective",
    "UnevenGather",
    "Unseen",
    "counting_allreduce",
    "tap",
    "unseen",
]
