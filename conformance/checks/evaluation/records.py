"""What one rank's evaluation left behind: each probe's typed slice, and the rank's record.

Plain data (no torch): a rank returns an :class:`EvalRank` to the supervisor, which judges the
ranks' records against the 1-rank reference's (``judge``). Every field is something measured on
the rank; nothing here is a conclusion.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict

# The shared probes' slices (``harness.observe``): the samples fetched and the collectives called.
from ...harness.observe import CollectiveSlice, SamplesSlice


@dataclass(frozen=True)
class ForwardSlice:
    """The model's forward during ``evaluate``, seen by a pre-hook on the inner module."""

    calls: int
    rows: int  # dim 0 of the first tensor argument, summed over the calls
    #: Forwards that ran with autograd on (``torch.is_grad_enabled()``): an eval forward records
    #: a graph, and through DDP prepares a reduction for a backward that never comes.
    grad_enabled_calls: int
    #: Modules whose behaviour depends on the mode (BatchNorm, Dropout, ...) found in train mode
    #: at some forward, by name.
    train_mode_modules: tuple[str, ...]
    #: Parameters that had no gradient before evaluate and have one after it (a backward ran).
    grads_written: tuple[str, ...]


class ForwardPart(TypedDict):
    forward: ForwardSlice


@dataclass(frozen=True)
class BufferSlice:
    """Buffers (BatchNorm running statistics...) before and after ``evaluate``."""

    compared: int
    changed: tuple[str, ...]


class BufferPart(TypedDict):
    buffers: BufferSlice


class ShardReadPart(TypedDict):
    #: Sharded parameters whose local shard the target's code read (``to_local()``) in evaluate.
    shard_reads: tuple[str, ...]


@dataclass(frozen=True)
class StepSlice:
    """The training step run right after ``evaluate`` (``model.train()``, then ``train_step``)."""

    ran: bool
    error: str | None = None


@dataclass(frozen=True)
class EvalRank:
    """One rank's evaluation: what ``evaluate`` returned or raised, and every observer's slice."""

    rank: int
    world_size: int
    metrics: dict[str, float] | None  # None: evaluate raised (``error``)
    error: str | None
    params_digest: str  # the weights evaluated (equal in the N-rank and the 1-rank runs)
    forward: ForwardSlice
    samples: SamplesSlice
    collectives: CollectiveSlice
    buffers: BufferSlice
    step: StepSlice = field(default_factory=lambda: StepSlice(ran=False))
    seconds: float = 0.0
    #: Where evaluate was when it raised: the torch.distributed call and the user's line that
    #: made it ("recv at eval.py:16"), None when the error came from elsewhere or nothing raised.
    error_call: str | None = None
    #: Sharded (FSDP2) parameters whose local shard evaluate's own code read (``ShardReads``).
    shard_reads: tuple[str, ...] = ()
