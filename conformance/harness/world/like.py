"""``WorldLike``: what a check may ask of any world — local, attached, or a rank-0 reference."""

from __future__ import annotations

from typing import Any, Callable, Protocol, runtime_checkable

from ._results import RankResult, T


@runtime_checkable
class WorldLike(Protocol):
    """N ranks that run a work function and return one RankResult per rank, in rank order.

    Satisfied by ``World`` (spawned ranks under a supervisor), ``AttachedWorld`` (this process
    is one rank of a torchrun/srun launch) and ``RankZeroLocalWorld`` (a 1-rank reference
    world spawned by rank 0 under a launcher).
    """

    world_size: int
    backend: str
    generation: int  # how many times the ranks were (re)started
    restarts: list[str]  # why each previous generation was replaced

    @property
    def hostnames(self) -> list[str]:
        """Every rank's host seen so far ([] before the first call)."""
        ...

    def start(self) -> WorldLike:
        """Make the ranks ready (a no-op when they are); returns the world."""
        ...

    def run(self, fn: Callable[..., T], *args: Any, deadline: float | None = None,
            **kwargs: Any) -> list[RankResult[T]]:
        """``fn(rank_ctx, *args, **kwargs)`` on every rank; RankFailure or WorldHang if a rank
        raised, died or ran past ``deadline``."""
        ...

    def close(self) -> None:
        """Stop and reap every process of the world; safe to call twice."""
        ...
