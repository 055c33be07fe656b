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


def _supervisor_pipe() -> Any:
    """The rank's end of its pipe to the supervisor (found among live objects: the work
    function is deliberately not given it, so only a test can write outside the protocol)."""
    import gc
    from multiprocessing.connection import Connection

    return next(o for o in gc.get_objects() if isinstance(o, Connection) and not o.closed)


def garble_then_return(ctx: Any, bad_rank: int) -> int:
    """``bad_rank`` writes a frame that is not a protocol message before its real reply."""
    if ctx.rank == bad_rank:
        _supervisor_pipe().send_bytes(b"\x80\x04garbage that is not a pickle")
    return ctx.rank


def stale_reply_then_return(ctx: Any, bad_rank: int) -> int:
    """``bad_rank`` first answers a call that is not running (an old call id)."""
    if ctx.rank == bad_rank:
        from conformance.harness.world._protocol import encode
        from conformance.harness.world import RankResult

        _supervisor_pipe().send_bytes(encode("result", 10_000, RankResult(ctx.rank, "stale")))
    return ctx.rank


def busy_forever(ctx: Any) -> None:
    """Every rank stays busy in Python, never reading the stop message."""
    while True:
        time.sleep(0.01)


def exit_while_peer_in_collective(ctx: Any, how: str = "exit") -> None:
    """Rank 1 exits (``os._exit(3)``) or segfaults; rank 0 is inside an all-reduce with it and
    gets 'connection reset' (or a timeout): the cause is rank 1, the symptom rank 0."""
    import torch
    import torch.distributed as dist

    if ctx.rank == 1:
        time.sleep(0.2)
        if how == "segfault":
            import ctypes

            ctypes.string_at(0)  # SIGSEGV
        os._exit(3)
    dist.all_reduce(torch.ones(1))


def listening_inodes(ctx: Any) -> list[int]:
    """Socket inodes this rank holds open (to match against /proc/net/tcp{,6})."""
    inodes = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.append(int(link[8:-1]))
    return inodes


def torch_threads(ctx: Any) -> int:
    import torch

    return torch.get_num_threads()


def imported(ctx: Any, module: str) -> bool:
    import sys

    return module in sys.modules


def network_view(ctx: Any) -> dict[str, Any]:
    """This rank's network namespace, its interfaces and the qdisc on its loopback (as ``tc``
    started from the rank, which inherits the namespace, shows it)."""
    import subprocess

    qdisc = subprocess.run(["tc", "qdisc", "show", "dev", "lo"], capture_output=True, text=True,
                           timeout=10).stdout
    # /proc/self/net is per network namespace (/sys/class/net shows the one sysfs was mounted in).
    with open("/proc/self/net/dev") as f:
        interfaces = sorted(line.split(":")[0].strip() for line in f.readlines()[2:])
    return {"netns": os.readlink("/proc/self/ns/net"), "interfaces": interfaces,
            "qdisc": qdisc}


def start_facts(ctx: Any) -> dict[str, Any]:
    """How this rank was started: its parent, the cookie in its exec-time environment, and
    what its random generators draw (the zygote test compares ranks)."""
    import random

    import numpy
    import torch

    with open("/proc/self/environ", "rb") as f:
        environ = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
    cookie = environ.get(b"DDP_CONFORMANCE_COOKIE", b"").decode()
    return {"ppid": os.getppid(), "pid": os.getpid(), "cookie": cookie, "random": random.random(),
            "numpy": float(numpy.random.random()), "torch_seed": torch.initial_seed(),
            "env": os.environ.get("DDP_ZYGOTE_TEST", ""), "hash": hash("ddp-conformance"),
            "address": id(object())}


def parallel_matmul(ctx: Any, threads: int) -> float:
    """A parallel op on ``threads`` intra-op threads (hangs in a child forked after its parent's
    OpenMP pool ran: the zygote must never have run one)."""
    import torch

    torch.set_num_threads(threads)
    a = torch.ones(512, 512)
    return float((a @ a).sum().item())


class _Holder:
    """A tensor in a reference cycle, as a check's model is with its hooks."""

    def __init__(self, nbytes: int) -> None:
        import torch

        self.tensor = torch.ones(nbytes // 4)  # written: resident
        self.me = self


def rss_now(ctx: Any) -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) * 1024 for line in fh if line.startswith("VmRSS:"))


def leave_a_cycle(ctx: Any, nbytes: int) -> int:
    """Hold ``nbytes`` in a reference cycle and return: only a full collection frees them."""
    _Holder(nbytes)
    return rss_now(ctx)


def leave_a_device_cycle(ctx: Any, nbytes: int) -> int:
    """Like ``leave_a_cycle``, on the rank's CUDA device: the bytes reserved there on return."""
    import torch

    holder = _Holder(0)
    holder.tensor = torch.ones(nbytes // 4, device=ctx.device)
    del holder
    return int(torch.cuda.memory_reserved(ctx.device))


def device_reserved(ctx: Any) -> int:
    import torch

    return int(torch.cuda.memory_reserved(ctx.device))
