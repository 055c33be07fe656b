"""Where a fault strikes: the :class:`Site` a rank's loop offers, and the :class:`Fault` protocol.

Jepsen's nemesis, at the scale of one training loop: the loop does not know which fault it
runs with. At each injection point it builds a :class:`Site` and calls ``fault.inject(site)``;
the fault checks its own schedule (``fires``), records the injection and does its effect --
on this process (a delay, an exit, a freeze) or on the site's levers, which the loop reads
back (skip this collective, take this branch, stop: no more batches). No loop dispatches on
the type of a fault.

    site = Site("collective", rank, step, "backward", log, label="step1", tensor=t)
    fault.inject(site)
    if not site.skip:
        tracker.all_reduce(site.tensor, tag=site.label, on_issue=site.on_issue)
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

from ._log import InjectionLog, Named

PHASES = ("data", "forward", "backward", "optimizer")

#: The kinds of injection point, and the levers each offers:
#: "step": a phase boundary of a training step (``exhausted`` at "data": no batch left);
#: "collective": an explicit all-reduce about to be issued (``tensor``, ``skip``, ``on_issue``);
#: "branch": an optional path in a model's forward (``taken``);
#: "wrap": DDP construction (``ddp_kwargs``);
#: "link": the world's network, offered by whoever holds a world started with a private
#: network (``link``: its ``PrivateNetwork``, whose ``shape`` the fault calls);
#: "tensor": a value this rank computed, offered before anything reads it (``tensor``, which
#: a fault may replace; ``label`` names it: "output:<module>", "grad:<parameter>", or
#: "bucket:<index>" for an all-reduced bucket).
SITE_KINDS = ("step", "collective", "branch", "wrap", "link", "tensor")


def check_phase(phase: str) -> None:
    if phase not in PHASES:
        raise ValueError(f"phase={phase!r} is not one of {', '.join(PHASES)}")


@dataclass
class Site:
    """One point of one rank's loop where a fault may strike, with what the fault may change.

    Mutable on purpose, unlike the faults: it lives for one call of ``inject`` and carries the
    fault's decision back to the loop.
    """

    kind: str
    rank: int
    step: int
    phase: str
    log: InjectionLog = field(default_factory=InjectionLog)
    device: Any = None
    label: str = ""  # the collective's tag, the branch's name: what an injection record names
    # -- levers, read back by the loop after fault.inject(site) --
    exhausted: bool = False  # step/data: this rank's data pipeline has no batch for this step
    tensor: Any = None  # collective: what this rank all-reduces; tensor: the value (a fault may replace it)
    skip: bool = False  # collective: this rank does not issue it
    on_issue: Callable[[], None] | None = None  # collective: runs once the enqueue is on record
    taken: bool = False  # branch: this rank takes the optional path
    ddp_kwargs: dict[str, Any] = field(default_factory=dict)  # wrap: what DDP is built with
    link: Any = None  # link: the world's private network (``shape(LinkShape | None)``)

    def __post_init__(self) -> None:
        if self.kind not in SITE_KINDS:
            raise ValueError(f"site kind={self.kind!r} is not one of {', '.join(SITE_KINDS)}")
        check_phase(self.phase)

    def mark(self, fault: Named, **data: Any) -> None:
        """Record an instantaneous injection here (a branch taken, a collective skipped)."""
        self.log.mark(fault, self.rank, self.step, self.phase, **data)

    def window(self, fault: Named, **data: Any) -> AbstractContextManager[None]:
        """Record the wall-clock window of the injection performed inside the ``with``."""
        return self.log.window(fault, self.rank, self.step, self.phase, **data)


class Fault(Protocol):
    """A nemesis: a frozen dataclass whose schedule is data and which owns its effect."""

    @property
    def name(self) -> str: ...

    def fires(self, rank: int, step: int, phase: str) -> bool:
        """Whether the fault strikes at (rank, step, phase): a pure function of its fields."""
        ...

    def inject(self, site: Site) -> bool:
        """At a site where it fires: record the injection in ``site.log`` and do the effect.
        Returns whether it fired (a fault that ends or freezes the process never returns)."""
        ...


@dataclass(frozen=True, slots=True)
class NoFault:
    """The fault that never fires: an unfaulted baseline measured through the very same loop."""

    name: str = "no-fault"

    def fires(self, rank: int, step: int, phase: str) -> bool:
        return False

    def inject(self, site: Site) -> bool:
        return False


NO_FAULT = NoFault()


def fires_at(fault: Fault, site: Site, kind: str) -> bool:
    """True where ``fault`` acts: at sites of ``kind`` that its schedule selects."""
    return site.kind == kind and fault.fires(site.rank, site.step, site.phase)


def faulted_step(fault: Fault, *, rank: int, step: int, log: InjectionLog, device: Any, model: Any,
                 optimizer: Any, compute_loss: Callable[[Any, Any, Any], Any],
                 batch: Callable[[], tuple[Any, Any]]) -> bool:
    """One training step with a "step" site at each phase; False when this rank's data ran out.

    The step is the textbook one (zero_grad, forward and loss, backward, optimizer step), the
    same as a target's default ``train_step`` on one microbatch; ``compute_loss(model, inputs,
    targets)`` is the loss, ``batch()`` draws this step's batch.
    """

    def at(phase: str) -> Site:
        site = Site("step", rank, step, phase, log, device=device)
        fault.inject(site)
        return site

    if at("data").exhausted:
        return False
    inputs, targets = batch()
    optimizer.zero_grad(set_to_none=True)
    at("forward")
    loss = compute_loss(model, inputs, targets)

    # The backward site runs inside autograd, from a hook on the loss: before any gradient
    # reaches a parameter, so before DDP's bucket hooks launch a single all-reduce. A delay
    # there launches them all late, as a slow GPU would; a death there is a rank lost while its
    # peers wait in their all-reduce, as a crashed node would be.
    def in_backward(grad: Any) -> None:
        at("backward")

    loss.register_hook(in_backward)
    loss.backward()
    at("optimizer")
    optimizer.step()
    return True
