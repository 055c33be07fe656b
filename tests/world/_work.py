"""Work functions the World tests send to ranks (module-level: pickled by reference)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any


def rank_and_pid(ctx: Any) -> tuple[int, int]:
    return ctx.rank, os.getpid()


def allreduce_sum(ctx: Any, value: float) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([value + ctx.rank])
    dist.all_reduce(t)
    return float(t.item())


def block_forever_on(ctx: Any, stuck_rank: int) -> None:
    """``stuck_rank`` never enters the all-reduce; the others block in it waiting for it."""
    import torch
    import torch.distributed as dist

    if ctx.rank == stuck_rank:
        while True:
            time.sleep(0.05)
    dist.all_reduce(torch.ones(1))


def raise_on(ctx: Any, bad_rank: int) -> None:
    import torch
    import torch.distributed as dist

    if ctx.rank == bad_rank:
        raise ValueError(f"injected failure on rank {bad_rank}")
    dist.all_reduce(torch.ones(1))


def sigkill_mid_collective(ctx: Any, victim: int) -> None:
    """Every rank enters an all-reduce; the victim kills itself once it is inside."""
    import threading

    import torch
    import torch.distributed as dist

    if ctx.rank == victim:
        threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGKILL)).start()
        dist.barrier()  # peers are in this collective too; the victim dies while waiting
        time.sleep(60)
    dist.barrier()
    dist.all_reduce(torch.ones(1))


def exit_with(ctx: Any, victim: int, code: int) -> None:
    if ctx.rank == victim:
        os._exit(code)
    import torch
    import torch.distributed as dist

    dist.all_reduce(torch.ones(1))


def spawn_grandchild(ctx: Any) -> int:
    """A rank that forks a helper (like a DataLoader worker); returns the helper's pid."""
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    return proc.pid


def device_name(ctx: Any) -> str:
    return str(ctx.device)


def freeze_on(ctx: Any, frozen_rank: int) -> None:
    """``frozen_rank`` stops itself (like a process hung in a driver call); peers wait on it."""
    import torch
    import torch.distributed as dist

    if ctx.rank == frozen_rank:
        os.kill(os.getpid(), signal.SIGSTOP)
    dist.all_reduce(torch.ones(1))
