"""The rank side of one check, from the target's spec to the model the step trains.

Every rank-side entry of a check starts the same way: TF32 off, the target loaded, the
model built from the suite's seed on this rank's device, wrapped as production wraps it
(DDP with the target's ``ddp_kwargs``, then its ``configure_ddp``), the optimizer built on
the wrapped model. :class:`RankRun` is that preamble, written once:

    run = RankRun.load(rank_ctx, target_spec)          # TF32 off, the target loaded
    wrapped = run.build_wrapped(seed=MODEL_SEED)       # built, seeded, wrapped
    optimizer = wrapped.make_optimizer()

An engine that must act on the model between building and wrapping (dropout off, BatchNorm
grouped, the reference's initial weights checked) passes ``before_wrap``; what it returns
comes back as ``wrapped.settled``. A check that runs the target's own loop builds no model:
``run.loop_context(...)`` is the ``ctx`` its ``run_loop`` receives, whose ``ctx.wrap`` wraps the
same way: :meth:`RankRun.build_wrapped` and ``ctx.wrap`` are the two doors to ``ddp.wrap``,
the one place a model is wrapped.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Generic, TypeVar, overload

from .ddp import MODEL_SEED, LoopContext, build_model, disable_tf32, effective_ddp_kwargs, unwrap, wrap
from .targets.loading import load_target
from .targets.target import Target
from .world import RankContext

S = TypeVar("S")


@dataclass(frozen=True, slots=True)
class Wrapped(Generic[S]):
    """The model of one run on this rank, built and wrapped (:meth:`RankRun.build_wrapped`)."""

    run: RankRun
    #: What the step trains: the DDP model, or the module around it that ``configure_ddp`` returned.
    ddp: Any
    #: The user's module inside it (parameters, buffers, state_dict).
    model: Any
    #: The DDP arguments it was wrapped with (``ddp.effective_ddp_kwargs``).
    ddp_kwargs: dict[str, Any]
    #: What ``before_wrap`` returned (None without one).
    settled: S

    def make_optimizer(self) -> Any:
        """The target's optimizer over the wrapped model (``TargetCalls.make_optimizer``)."""
        return self.run.target.make_optimizer(self.ddp)


@dataclass(frozen=True, slots=True)
class RankRun:
    """One check's side on this rank: the loaded target and where this rank stands."""

    target: Target
    rank: int
    world_size: int
    device: Any

    @classmethod
    def load(cls, rank_ctx: RankContext, target_spec: str) -> RankRun:
        """TF32 off (``ddp.disable_tf32``: the checks compare fp32 to fp32), then the target
        loaded on this rank (cached per process: a persistent world loads it once)."""
        disable_tf32()
        return cls(load_target(target_spec), rank_ctx.rank, rank_ctx.world_size, rank_ctx.device)

    def build(self, *, seed: int = MODEL_SEED) -> Any:
        """The target's model, seeded ``seed``, on this rank's device (``ddp.build_model``)."""
        return build_model(self.target, self.device, seed=seed)

    def ddp_kwargs(self, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
        """The target's ``ddp_kwargs`` as the suite applies them, ``overrides`` on top."""
        return effective_ddp_kwargs(self.target, overrides)

    @overload
    def build_wrapped(self, *, seed: int = ..., ddp_overrides: dict[str, Any] | None = ...,
                      before_wrap: None = ...) -> Wrapped[None]: ...

    @overload
    def build_wrapped(self, *, seed: int = ..., ddp_overrides: dict[str, Any] | None = ...,
                      before_wrap: Callable[[Any], S]) -> Wrapped[S]: ...

    def build_wrapped(self, *, seed: int = MODEL_SEED, ddp_overrides: dict[str, Any] | None = None,
                      before_wrap: Callable[[Any], Any] | None = None) -> Wrapped[Any]:
        """The model built from ``seed``, handed to ``before_wrap`` (the engine's own step
        before DDP sees it), then wrapped as production wraps it: DDP on this rank's device with
        the target's ``ddp_kwargs`` (``ddp_overrides`` on top), then its ``configure_ddp``."""
        model = self.build(seed=seed)
        settled = None if before_wrap is None else before_wrap(model)
        kwargs = self.ddp_kwargs(ddp_overrides)
        # DDP's construction broadcasts rank 0's parameters and buffers: a collective, so every
        # rank of the group starts the same runs in the same order.
        ddp = wrap(model, self.device, kwargs, target=self.target)
        return Wrapped(self, ddp, unwrap(ddp), kwargs, settled)

    def loop_context(self, *, steps: int, tmpdir: Path, **extra: Any) -> LoopContext:
        """The ``ctx`` the target's ``run_loop`` receives on this rank: ``ctx.wrap`` wraps with
        the target's ``ddp_kwargs`` and ``configure_ddp``, as :meth:`wrap` does; ``extra``: the
        loop's other fields (``on_wrap``, ``checkpoint_dir``, ``checkpoint_every``, ``restarts``,
        ``epochs``, ``steps_per_epoch``)."""
        return LoopContext(rank=self.rank, world_size=self.world_size, device=self.device, steps=steps,
                           tmpdir=tmpdir, ddp_kwargs=self.ddp_kwargs(), target=self.target, **extra)
