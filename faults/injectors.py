"""Faults as data, each owning its effect: what to inject, on which rank, at which step and phase.

A fault is a frozen dataclass; ``fault.fires(rank, step, phase)`` is a pure function of its
fields, so the same schedule replays identically on every run (never wall-clock chance). The
incident's ``random.random() > 0.5`` is modelled by ``ConditionalBranch(seed=...)``: a per-rank
draw from an RNG seeded by (seed, rank, step) -- random-looking, but reproducible.

``fault.inject(site)`` is its effect (the :class:`~faults.sites.Fault` protocol): a rank's loop
offers a :class:`~faults.sites.Site` at each injection point; where the schedule fires, the
fault records an :class:`~faults._log.Injection` and strikes. Each fault acts at one kind of
site only, so the loop can offer every site to whatever fault it runs with.

    SlowRank(rank=1, phase="backward", delay_s=0.05, steps=range(2, 8)).fires(1, 3, "backward")
"""

from __future__ import annotations

import os
import random
import signal
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from conformance.harness.world import LinkShape

from .sites import PHASES, Site, check_phase, fires_at

__all__ = ["PHASES", "BucketConfig", "ConditionalBranch", "DeadRank", "SkipCollective", "SlowLink",
           "SlowPair", "SlowRank", "StalledRank", "UnevenBatches", "delay", "freeze"]


def _steps(value: Iterable[int] | None) -> tuple[int, ...] | None:
    return None if value is None else tuple(int(s) for s in value)


@dataclass(frozen=True, slots=True)
class ConditionalBranch:
    """An auxiliary path taken only on some ranks/steps: the incident's dynamic branch.

    ``ranks``/``steps`` give an explicit schedule (None = all) of where the branch is taken --
    or, with ``skip=True``, where it is *not* taken (taken everywhere else: the shape of a
    branch that DDP has seen used, then is skipped by one rank). With ``seed`` set, each
    (rank, step) draws ``random() > threshold`` from its own seeded RNG instead.
    """

    ranks: tuple[int, ...] | None = None
    steps: tuple[int, ...] | None = None
    seed: int | None = None
    threshold: float = 0.5
    skip: bool = False
    name: str = "conditional-branch"

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranks", _steps(self.ranks))
        object.__setattr__(self, "steps", _steps(self.steps))
        if not 0.0 <= self.threshold < 1.0:
            raise ValueError(f"threshold={self.threshold} must be in [0, 1)")

    def fires(self, rank: int, step: int, phase: str = "forward") -> bool:
        if phase != "forward":
            return False
        if self.seed is not None:
            # String seeds hash deterministically (unlike hash() of a tuple of ints across
            # interpreter versions, which is stable too, but this reads plainly).
            return random.Random(f"{self.seed}/{rank}/{step}").random() > self.threshold
        matched = ((self.ranks is None or rank in self.ranks)
                   and (self.steps is None or step in self.steps))
        return matched != self.skip

    def inject(self, site: Site) -> bool:
        """At a "branch" site where it fires: the rank takes the optional path."""
        if not fires_at(self, site, "branch"):
            return False
        site.mark(self, branch=site.label)
        site.taken = True
        return True


@dataclass(frozen=True, slots=True)
class SlowRank:
    """A rank that is ``delay_s`` slower in one phase: a throttled GPU, a slow data loader."""

    rank: int
    phase: str = "forward"
    delay_s: float = 0.05
    steps: tuple[int, ...] | None = None
    name: str = "slow-rank"

    def __post_init__(self) -> None:
        check_phase(self.phase)
        object.__setattr__(self, "steps", _steps(self.steps))
        if self.delay_s <= 0:
            raise ValueError(f"delay_s={self.delay_s} must be positive seconds")

    def fires(self, rank: int, step: int, phase: str) -> bool:
        return rank == self.rank and phase == self.phase and (self.steps is None or step in self.steps)

    def inject(self, site: Site) -> bool:
        """At a "step" site where it fires: this rank is ``delay_s`` slower (see :func:`delay`)."""
        if not fires_at(self, site, "step"):
            return False
        with site.window(self, delay_s=self.delay_s):
            delay(self.delay_s, site.device)
        return True


@dataclass(frozen=True, slots=True)
class BucketConfig:
    """A ``bucket_cap_mb`` per rank (``per_rank``) or one for all: tiny, huge or mismatched."""

    bucket_cap_mb: float = 25.0
    per_rank: tuple[float, ...] | None = None
    name: str = "bucket-config"

    def __post_init__(self) -> None:
        values = (self.bucket_cap_mb, *(self.per_rank or ()))
        if any(v <= 0 for v in values):
            raise ValueError(f"bucket_cap_mb values {values} must all be positive")
        if self.per_rank is not None:
            object.__setattr__(self, "per_rank", tuple(float(v) for v in self.per_rank))

    def cap_for(self, rank: int) -> float:
        if self.per_rank is not None and rank < len(self.per_rank):
            return self.per_rank[rank]
        return self.bucket_cap_mb

    @property
    def mismatched(self) -> bool:
        return self.per_rank is not None and len(set(self.per_rank)) > 1

    def fires(self, rank: int, step: int, phase: str) -> bool:
        return self.mismatched and step == 0 and phase == "data"

    def inject(self, site: Site) -> bool:
        """At the "wrap" site, when the caps differ across ranks: this rank's DDP gets its own."""
        if not fires_at(self, site, "wrap"):
            return False
        site.ddp_kwargs["bucket_cap_mb"] = self.cap_for(site.rank)
        site.mark(self, bucket_cap_mb=self.cap_for(site.rank),
                  find_unused_parameters=bool(site.ddp_kwargs.get("find_unused_parameters", False)))
        return True


@dataclass(frozen=True, slots=True)
class DeadRank:
    """A rank that exits (``how="exit"``) or is SIGKILLed (``"kill"``) at (step, phase)."""

    rank: int
    step: int = 1
    phase: str = "backward"
    how: str = "exit"
    name: str = "dead-rank"

    def __post_init__(self) -> None:
        check_phase(self.phase)
        if self.how not in ("exit", "kill"):
            raise ValueError(f"how={self.how!r} is not 'exit' or 'kill'")

    def fires(self, rank: int, step: int, phase: str) -> bool:
        return rank == self.rank and step == self.step and phase == self.phase

    def inject(self, site: Site) -> bool:
        """At a "step" site where it fires: this process ends, recorded first (never returns).

        The record is on file before the exit (the log closes each line it writes), so a rank
        that dies here is counted although it never hands back its results.
        """
        if not fires_at(self, site, "step"):
            return False
        site.mark(self, how=self.how)
        sys.stdout.flush()
        if self.how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(1)


@dataclass(frozen=True, slots=True)
class SkipCollective:
    """A rank that skips one collective at ``step`` -- or, with ``shape_mismatch``, issues it
    with a different shape (gloo then aborts the process instead of mispairing silently)."""

    rank: int
    step: int = 1
    shape_mismatch: bool = False
    name: str = "skip-collective"

    def fires(self, rank: int, step: int, phase: str = "backward") -> bool:
        return rank == self.rank and step == self.step and phase == "backward"

    def inject(self, site: Site) -> bool:
        """At a "collective" site where it fires: skip it, or issue twice as many elements."""
        if not fires_at(self, site, "collective"):
            return False
        if self.shape_mismatch:
            site.tensor = site.tensor.new_ones(2 * site.tensor.numel())
            site.mark(self, shape=list(site.tensor.shape))
        else:
            site.mark(self, skipped=site.label)
            site.skip = True
        return True


@dataclass(frozen=True, slots=True)
class StalledRank:
    """A rank whose transport stalls inside the collective at ``step``: it enters the
    all-reduce (the tracker records the enqueue) and its process is then frozen with SIGSTOP,
    as a wedged NIC driver or a GPU stuck in a kernel leaves it -- alive, its sockets open, its
    process-group timeout never firing, never progressing.

    The freeze happens after the enqueue is recorded and before the rank's data leaves, not on
    a timer after the collective is issued: a 32-byte gloo all-reduce completes in well under a millisecond,
    so a timer would race it, and a rank frozen *after* the exchange leaves its peers one
    collective ahead (a "never entered" divergence, not a stall). Frozen first, the collective
    is entered on every rank and completes on none, every run.
    """

    rank: int
    step: int = 1
    phase: str = "backward"
    name: str = "stalled-rank"

    def __post_init__(self) -> None:
        check_phase(self.phase)
        if self.step < 0:
            raise ValueError(f"step={self.step} must be a step number (0 or more)")

    def fires(self, rank: int, step: int, phase: str = "backward") -> bool:
        return rank == self.rank and step == self.step and phase == self.phase

    def inject(self, site: Site) -> bool:
        """At a "collective" site where it fires: freeze as the rank hands the collective over.

        Recorded (to the file: this rank never returns) before it freezes, inside the
        collective: its enqueue is on record, its data never leaves.
        """
        if not fires_at(self, site, "collective"):
            return False

        def stall() -> None:
            site.mark(self, stalled=site.label, pid=os.getpid())
            freeze()

        site.on_issue = stall
        return True


@dataclass(frozen=True, slots=True)
class UnevenBatches:
    """A rank whose data pipeline yields only ``batches`` batches, while its peers go on: the
    epoch that ends one step early on one rank (its peers then wait in a collective it never
    enters)."""

    rank: int
    batches: int
    name: str = "uneven-batches"

    def __post_init__(self) -> None:
        if self.batches < 0:
            raise ValueError(f"batches={self.batches} must be a batch count (0 or more)")

    def fires(self, rank: int, step: int, phase: str = "data") -> bool:
        """True where the short pipeline shows: at "data" of every step past its last batch."""
        return rank == self.rank and phase == "data" and step >= self.batches

    def inject(self, site: Site) -> bool:
        """At the "step" site of "data" where it fires: no batch -- the rank leaves its loop."""
        if not fires_at(self, site, "step"):
            return False
        site.mark(self, batches=self.batches)
        site.exhausted = True
        return True


@dataclass(frozen=True, slots=True)
class SlowLink:
    """The world's interconnect slowed to ``rate_gbps``: its ranks run in a private network
    namespace (a World started with ``private_network=True``) whose loopback is shaped with
    ``tc tbf`` (conformance/harness/world/_netns.py), so every gloo byte and nothing else
    crosses the slow link, and nothing reaches the host's network.

    Scheduled by step like the others (``steps``: where the link is slow; None: from the first
    "link" site on). Where a "link" site's step is outside ``steps`` the link is unshaped again,
    so a schedule of steps is a window of slowness, recorded with its rate.

        SlowLink(rate_gbps=0.2).inject(Site("link", 0, 0, "data", log, link=world.link))
    """

    rate_gbps: float
    steps: tuple[int, ...] | None = None
    burst_bytes: int | None = None
    latency_s: float = 1.0
    name: str = "slow-link"

    def __post_init__(self) -> None:
        object.__setattr__(self, "steps", _steps(self.steps))
        self.shape()  # the same validation as the link will apply: a bad rate fails here

    def shape(self) -> LinkShape:
        return LinkShape(rate_bits_per_s=self.rate_gbps * 1e9, burst_bytes=self.burst_bytes,
                         latency_s=self.latency_s)

    def fires(self, rank: int, step: int, phase: str = "data") -> bool:
        return phase == "data" and (self.steps is None or step in self.steps)

    def inject(self, site: Site) -> bool:
        """At a "link" site: shape the world's link where the schedule fires, unshape it where
        it does not (after a window). The injection is recorded on the site's log."""
        if site.kind != "link" or site.link is None:
            return False
        if not self.fires(site.rank, site.step, site.phase):
            if getattr(site.link, "shape_now", None) is not None:
                site.link.shape(None)
            return False
        shape = self.shape()
        site.link.shape(shape)
        site.mark(self, rate_gbps=self.rate_gbps, burst_bytes=shape.burst, mtu=shape.mtu)
        return True


@dataclass(frozen=True, slots=True)
class SlowPair:
    """The link between two ranks slowed to ``rate_gbps``, the others' untouched: the slow pair
    of a node (a degraded cable, a NIC at a lower link width). It acts at a "link" site whose
    link can shape one pair (``shape_pair``: the node-health check's ring pairs, each rank on
    an address of its own in the world's private network, ``faults/checks/node_health/pairs.py``)
    and is recorded with the pair and its rate; nothing else is slowed.

        SlowPair(pair=(1, 2), rate_gbps=0.2).inject(Site("link", 0, 0, "data", log, link=pairs))
    """

    pair: tuple[int, int]
    rate_gbps: float
    burst_bytes: int | None = None
    name: str = "slow-pair"

    def __post_init__(self) -> None:
        pair = tuple(sorted(int(r) for r in self.pair))
        if len(pair) != 2 or pair[0] == pair[1] or pair[0] < 0:
            raise ValueError(f"pair={self.pair!r} must be two different ranks")
        object.__setattr__(self, "pair", pair)
        self.shape()  # the same validation as the link will apply: a bad rate fails here

    def shape(self) -> LinkShape:
        return LinkShape(rate_bits_per_s=self.rate_gbps * 1e9, burst_bytes=self.burst_bytes)

    def fires(self, rank: int, step: int, phase: str = "data") -> bool:
        return phase == "data"

    def inject(self, site: Site) -> bool:
        """At a "link" site whose link shapes pairs: that pair shaped, the injection recorded."""
        if site.kind != "link" or getattr(site.link, "shape_pair", None) is None:
            return False
        if not self.fires(site.rank, site.step, site.phase):
            return False
        shape = self.shape()
        site.link.shape_pair(self.pair, shape)
        site.mark(self, pair=list(self.pair), rate_gbps=self.rate_gbps, burst_bytes=shape.burst)
        return True


def delay(seconds: float, device: Any = None) -> None:
    """Make this rank ``seconds`` slower: device time on a GPU, wall time on a CPU.

    On CUDA the delay is a device-side spin (``torch.cuda._sleep``) so it is real GPU time that
    the all-reduce must wait for, as a throttled GPU would be; a host sleep would only delay
    the kernel launches. On CPU a sleep is enough: the gloo all-reduce of the peers waits.
    """
    if device is not None and getattr(device, "type", None) == "cuda":
        import torch

        props = torch.cuda.get_device_properties(device)
        khz = getattr(props, "clock_rate", 0) or 1_500_000  # kHz; fall back to 1.5 GHz
        torch.cuda._sleep(int(seconds * khz * 1000))
        return
    time.sleep(seconds)


def freeze() -> None:
    """Stop this whole process (every thread) until a SIGCONT that never comes.

    SIGSTOP cannot be caught or ignored, and ``kill`` to oneself delivers it before returning,
    so nothing after this call runs -- not the gloo timeout, not faulthandler's SIGUSR1
    handler. SIGKILL still ends a stopped process, which is how the supervisor clears it.
    """
    os.kill(os.getpid(), signal.SIGSTOP)
