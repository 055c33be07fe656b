"""Built-in vehicles: small, self-contained models that faults are injected into.

Injected-mode chaos checks use these rather than the built-in targets, so that what is
injected (which parameters sit behind the branch, how many buckets a cap gives) is known
exactly and does not move when a target file changes. A :class:`VehicleSpec` is plain data,
sent to the ranks, where :func:`resolve` turns it -- or a target spec string -- into the
same target interface the checks use for a user's target.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import nn

from conformance.harness.targets import TargetCalls

from ._log import InjectionLog
from .injectors import ConditionalBranch
from .sites import Fault, Site

AUX_PREFIX = "aux_head."
IN, HIDDEN, OUT = 16, 32, 4


class BranchyVehicle(nn.Module):
    """Trunk + head, and an auxiliary head used only where ``fault`` takes the branch.

    Each forward offers the fault a "branch" site (forward calls count the steps); the aux
    head runs where the fault set ``site.taken``. ``aux_head`` is registered last, so DDP puts
    its gradients in the *first* bucket (buckets follow reverse parameter order): the bucket a
    rank that skipped the branch never fills.
    """

    def __init__(self, fault: Fault, rank: int, log: InjectionLog | None = None) -> None:
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(IN, HIDDEN), nn.Tanh())
        self.head = nn.Linear(HIDDEN, OUT)
        self.aux_head = nn.Sequential(nn.Linear(HIDDEN, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, OUT))
        self.fault, self.rank = fault, rank
        self.log = log if log is not None else InjectionLog()  # in memory: nobody reads it
        self.step = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.trunk(x)
        out = self.head(h)
        site = Site("branch", self.rank, self.step, "forward", self.log, label=AUX_PREFIX.rstrip("."))
        self.fault.inject(site)
        if site.taken:
            out = out + self.aux_head(h)
        self.step += 1
        return out


def mlp(width: int = 256, depth: int = 6) -> nn.Module:
    """A plain MLP: every parameter used every step; ``depth`` Linear layers of ``width``."""
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.Tanh()]
    return nn.Sequential(*layers)


@dataclass(frozen=True, slots=True)
class VehicleSpec:
    """Which vehicle to build: ``kind`` "mlp" (width x depth) or "branchy" (with ``branch``)."""

    kind: str = "mlp"
    width: int = 256
    depth: int = 6
    branch: ConditionalBranch = field(default_factory=ConditionalBranch)
    ddp_kwargs: tuple[tuple[str, Any], ...] = (("find_unused_parameters", False),)

    def __post_init__(self) -> None:
        if self.kind not in ("mlp", "branchy"):
            raise ValueError(f"vehicle kind={self.kind!r} is not 'mlp' or 'branchy'")

    @property
    def name(self) -> str:
        return f"vehicle-{self.kind}" if self.kind == "branchy" else f"vehicle-mlp{self.width}x{self.depth}"

    @property
    def aux_parameter_names(self) -> list[str]:
        model = BranchyVehicle(self.branch, 0)
        return [n for n, _ in model.named_parameters() if n.startswith(AUX_PREFIX)]


def _default_step(model: Any, optimizer: Any, microbatches: list[tuple[Any, Any]],
                  loss_fn: Callable[[Any, Any], Any]) -> None:
    from conformance.harness.targets import default_train_step

    default_train_step(model, optimizer, microbatches, loss_fn)


@dataclass
class Vehicle(TargetCalls):
    """The target interface (the fields the chaos checks use) for a built vehicle."""

    name: str
    build_model: Callable[[], nn.Module]
    make_batch: Callable[[Any, int], tuple[torch.Tensor, torch.Tensor]]
    ddp_kwargs: dict[str, Any]
    loss_fn: Callable[[Any, Any], Any] = nn.functional.mse_loss
    build_optimizer: Callable[[Any], Any] = lambda params: torch.optim.SGD(params, lr=0.1)
    train_step: Callable[..., None] = _default_step
    run_loop: Callable[[Any], None] | None = None
    spec: Any = None


def build_vehicle(spec: VehicleSpec, rank: int, log: InjectionLog | None = None) -> Vehicle:
    if spec.kind == "branchy":
        def make(generator: Any, n: int) -> tuple[torch.Tensor, torch.Tensor]:
            return torch.randn(n, IN, generator=generator), torch.randn(n, OUT, generator=generator)

        return Vehicle(spec.name, lambda: BranchyVehicle(spec.branch, rank, log), make,
                       dict(spec.ddp_kwargs), spec=spec)

    def make_wide(generator: Any, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.randn(n, spec.width, generator=generator),
                torch.randn(n, spec.width, generator=generator))

    return Vehicle(spec.name, lambda: mlp(spec.width, spec.depth), make_wide, dict(spec.ddp_kwargs),
                   spec=spec)


def resolve(source: Any, rank: int, log: InjectionLog | None = None) -> Any:
    """A target (spec string) or a vehicle (VehicleSpec), with the same interface."""
    if isinstance(source, VehicleSpec):
        return build_vehicle(source, rank, log)
    from conformance.harness.targets import load_target

    return load_target(source)
