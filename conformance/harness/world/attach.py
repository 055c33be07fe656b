"""Attach mode: the launcher (torchrun, srun) owns the processes; this process is one rank.

    torchrun --standalone --nproc-per-node 2 -m conformance run --attach
    srun --ntasks-per-node 8 python -m conformance run --attach --backend nccl

``AttachedWorld.run(fn, *args)`` has the same contract as ``World.run``: it runs ``fn`` on the
current rank and gathers every rank's RankResult, so a check runs unchanged on many nodes.
There is no supervisor above us, so time is kept from inside: the process-group timeout makes
a blocked collective raise, and a faulthandler watchdog dumps the stacks and exits the process
if even that does not happen; the launcher then tears the other ranks down.
"""

from __future__ import annotations

import faulthandler
import ipaddress
import os
import shutil
import socket
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

from ..timing import DEFAULT_DEADLINE_S, pg_timeout_for
from ._loopback import loopback_interface
from ._rank import RankContext, _error
from ._results import LaunchedWorldUnreachable, RankFailure, RankResult, T, WorldError, WorldUnavailable, first_line
from .local import World


def pin_loopback_if_local() -> str:
    """Check, and pin, the interface gloo will use under a launcher; returns what it is.

    When the rendezvous address (MASTER_ADDR) is a loopback address — a single-node
    ``torchrun --standalone`` — and GLOO_SOCKET_IFNAME is unset, gloo is pinned to the
    loopback interface, so nothing this job opens faces the network. Otherwise the launcher's
    settings stand (several nodes must reach each other) and the answer says what gloo uses.
    """
    chosen = os.environ.get("GLOO_SOCKET_IFNAME")
    addr = os.environ.get("MASTER_ADDR", "")
    try:
        local = bool(addr) and ipaddress.ip_address(socket.gethostbyname(addr)).is_loopback
    except (OSError, ValueError):
        local = False
    if chosen:
        return f"GLOO_SOCKET_IFNAME={chosen} (set by the launcher or user)"
    if local:
        os.environ["GLOO_SOCKET_IFNAME"] = loopback_interface()
        return f"GLOO_SOCKET_IFNAME={os.environ['GLOO_SOCKET_IFNAME']} (MASTER_ADDR {addr} is loopback)"
    return (f"the interface of this host's name (GLOO_SOCKET_IFNAME unset, MASTER_ADDR {addr or '?'}); "
            f"set GLOO_SOCKET_IFNAME to choose it")


def launcher_env() -> dict[str, int] | None:
    """Rank, world size and local rank from torchrun or Slurm, or None when not launched."""
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return {"rank": int(env["RANK"]), "world_size": int(env["WORLD_SIZE"]),
                "local_rank": int(env.get("LOCAL_RANK", 0))}
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        return {"rank": int(env["SLURM_PROCID"]), "world_size": int(env["SLURM_NTASKS"]),
                "local_rank": int(env.get("SLURM_LOCALID", 0))}
    return None


class AttachedWorld:
    """The current process as one rank of a launcher-made world.

    As ``World``: a failed call raises a world error, which ``on_error`` (the owner's) sees first.
    """

    on_error: Callable[[WorldError], None] | None = None

    def __init__(self, backend: str = "gloo", *, deadline: float = DEFAULT_DEADLINE_S,
                 pg_timeout: float | None = None) -> None:
        info = launcher_env()
        if info is None:
            raise WorldUnavailable("--attach needs a launcher: run under torchrun (RANK, WORLD_SIZE, "
                                   "MASTER_ADDR set) or srun (SLURM_PROCID, SLURM_NTASKS)")
        self.rank, self.world_size, self.local_rank = info["rank"], info["world_size"], info["local_rank"]
        self.backend = backend
        self.deadline = deadline
        self.pg_timeout = pg_timeout if pg_timeout is not None else pg_timeout_for(deadline)
        self.generation = 1
        self.restarts: list[str] = []
        self._hostnames: list[str] = []  # every rank's host, known after the first call
        self.interface = ""  # which network interface gloo uses (pin_loopback_if_local)
        self._ctx: RankContext | None = None
        self._unreachable: str | None = None  # why joining failed: said again, never retried

    @property
    def alive(self) -> bool:
        return self._ctx is not None

    @property
    def hostnames(self) -> list[str]:
        return self._hostnames

    def start(self) -> AttachedWorld:
        if self._ctx is not None:
            return self
        if self._unreachable is not None:
            raise LaunchedWorldUnreachable(self._unreachable)
        import torch
        import torch.distributed as dist

        if "MASTER_ADDR" not in os.environ and "SLURM_PROCID" in os.environ:
            raise WorldUnavailable("under srun set MASTER_ADDR and MASTER_PORT (e.g. the first host "
                                   "of $SLURM_JOB_NODELIST and a free port) before --attach")
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, self.world_size)))
        if self.backend == "nccl":
            torch.cuda.set_device(self.local_rank)
            device = torch.device("cuda", self.local_rank)
        else:
            device = torch.device("cpu")
        self.interface = pin_loopback_if_local()
        if not dist.is_initialized():
            try:
                dist.init_process_group(self.backend, rank=self.rank, world_size=self.world_size,
                                        timeout=timedelta(seconds=self.pg_timeout))
            except Exception as exc:  # noqa: BLE001 - any failure to join ends the run the same way
                first = first_line(str(exc).strip()) or type(exc).__name__
                where = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
                self._unreachable = (
                    f"rank {self.rank} of {self.world_size} could not join the launched world within "
                    f"{self.pg_timeout:g} s ({first}); every rank must be started, and rank 0 hosts "
                    f"the rendezvous at {where}: check that the launcher started all "
                    f"{self.world_size} ranks and that MASTER_ADDR/MASTER_PORT reach rank 0")
                raise LaunchedWorldUnreachable(self._unreachable) from None
        side = dist.new_group(backend="gloo") if self.backend != "gloo" else dist.group.WORLD
        tmp = Path(tempfile.mkdtemp(prefix=f"ddp-attach-r{self.rank}-"))
        self._ctx = RankContext(rank=self.rank, world_size=self.world_size, backend=self.backend,
                                device=device, tmpdir=tmp, generation=1, local_rank=self.local_rank,
                                hostname=socket.gethostname(), group=dist.group.WORLD,
                                side_group=side, pg_timeout_s=self.pg_timeout)
        return self

    def run(self, fn: Callable[..., T], *args: Any, deadline: float | None = None,
            **kwargs: Any) -> list[RankResult[T]]:
        import torch.distributed as dist

        ctx = self.start()._ctx
        assert ctx is not None
        budget = self.deadline if deadline is None else deadline
        # The watchdog: if this rank is still inside fn (plus the gather) after the deadline
        # and a grace period, print every thread's stack and exit so the launcher notices.
        faulthandler.dump_traceback_later(budget + 10, exit=True, file=sys.stderr)
        start = time.perf_counter()
        try:
            try:
                mine = RankResult(self.rank, fn(ctx, *args, **kwargs), time.perf_counter() - start,
                                  pid=os.getpid(), hostname=ctx.hostname)
            except Exception as exc:
                mine = RankResult(self.rank, duration_s=time.perf_counter() - start, error=_error(exc),
                                  pid=os.getpid(), hostname=ctx.hostname)
            gathered: list[Any] = [None] * self.world_size
            # Every rank reaches this gather whether fn raised or not, so no rank is left
            # waiting for another's result; it runs on the gloo side group even under NCCL.
            dist.all_gather_object(gathered, mine, group=ctx.side_group)
        finally:
            faulthandler.cancel_dump_traceback_later()
        results = [r for r in gathered]
        self._hostnames = [r.hostname or "?" for r in results]
        if any(r.error is not None for r in results):
            bad = "; ".join(f"rank {r.rank} {r.error.describe()}" for r in results if r.error)
            failure = RankFailure(bad, results=results, elapsed_s=time.perf_counter() - start)
            if self.on_error is not None:
                self.on_error(failure)  # the user's own code raised: the owner's error, not a finding
            raise failure
        return results

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        if self._ctx is not None:  # this rank's scratch dir (ddp-attach-r*) goes with the run
            shutil.rmtree(self._ctx.tmpdir, ignore_errors=True)
        self._ctx = None

    def __enter__(self) -> AttachedWorld:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class RankZeroLocalWorld:
    """A real 1-rank world under attach mode, for single-process references.

    Equivalence checks run the target's own train_step at world size 1 as the reference.
    Under a launcher there is no such world, so rank 0 spawns one locally (a supervised
    ``World(1)`` on loopback) and shares its results with every rank; the other ranks only
    wait for that broadcast. Every rank calls ``run`` (they all execute the same check code).
    The local world's rank sees a 1-process torchrun job (``WORLD_SIZE=1``...), never this
    launcher's variables, from before the target is imported (docs/rank-environment.md).
    """

    def __init__(self, attached: AttachedWorld) -> None:
        self.attached = attached
        self.world_size = 1
        self.backend = attached.backend
        self.generation = 1
        self.restarts: list[str] = []
        self._local: World | None = None

    @property
    def hostnames(self) -> list[str]:
        return self._local.hostnames if self._local is not None else []

    def start(self) -> RankZeroLocalWorld:
        self.attached.start()
        return self

    def run(self, fn: Callable[..., T], *args: Any, deadline: float | None = None,
            **kwargs: Any) -> list[RankResult[T]]:
        import torch.distributed as dist

        ctx = self.attached.start()._ctx
        assert ctx is not None
        outcome: list[Any] = [None]
        if self.attached.rank == 0:
            if self._local is None:
                devices = [self.attached.local_rank] if self.backend == "nccl" else None
                self._local = World(1, self.backend, deadline=self.attached.deadline, devices=devices)
                self._local.on_error = self.attached.on_error
            try:
                outcome[0] = self._local.run(fn, *args, deadline=deadline, **kwargs)
            except Exception as exc:
                outcome[0] = exc
        # Every rank waits here for rank 0's reference, on the gloo side group (also under NCCL).
        dist.broadcast_object_list(outcome, src=0, group=ctx.side_group)
        if isinstance(outcome[0], BaseException):
            raise outcome[0]
        return outcome[0]

    def close(self) -> None:
        if self._local is not None:
            self._local.close()
            self._local = None
