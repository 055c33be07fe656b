"""The rank process: join the process group once, then serve work items until told to stop.

Runs in a spawned child of the supervisor. It never decides anything about deadlines: the
supervisor owns time. It only makes itself killable and inspectable:
- it dies with its parent (PR_SET_PDEATHSIG) and leads its own process group, so one
  ``killpg`` takes it and any DataLoader workers it forked;
- ``SIGUSR1`` makes faulthandler write every thread's Python stack to a per-rank file, which
  works even while the main thread is blocked inside a C++ collective.
"""

from __future__ import annotations

import faulthandler
import importlib
import multiprocessing
import os
import signal
import socket
import sys
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from ._containment import die_with_parent
from ._garbage import Collector
from ._launch_env import apply_environment
from ._loopback import LOOPBACK_HOST
from ._netns import join
from ._protocol import NO_CALL, ProtocolError, decode, encode
from ._results import RankError, RankResult


@dataclass
class RankContext:
    """What a work function receives as its first argument on every rank."""

    rank: int
    world_size: int
    backend: str
    device: Any  # torch.device
    tmpdir: Path
    generation: int
    local_rank: int = 0
    hostname: str = field(default_factory=socket.gethostname)
    group: Any = None  # the default process group (None means default for torch.distributed)
    side_group: Any = None  # a gloo group: object collectives and monitored_barrier, even under NCCL
    store: Any = None  # the rendezvous store (client side), for out-of-band signalling
    pg_timeout_s: float = 60.0
    cache: dict[str, Any] = field(default_factory=dict)  # survives between calls in a persistent world
    rendezvous: Any = None  # a private network's store at MASTER_ADDR:MASTER_PORT, served by rank 0


@dataclass(frozen=True)
class RankConfig:
    rank: int
    world_size: int
    backend: str
    store_host: str
    store_port: int
    store_prefix: str
    tmpdir: str
    generation: int
    pg_timeout_s: float
    device_index: int | None
    env: dict[str, str]
    threads: int
    parent_pid: int
    # Modules imported after the process group is up, before the rank reports ready (see
    # ``World``'s ``preload``).
    preload: tuple[str, ...] = ()
    # The rendezvous through a file instead of the supervisor's TCPStore, and the network
    # namespace the rank joins first (a World with ``private_network``: _netns.py).
    store_file: str | None = None
    netns: str | None = None
    # The world's containment cookie, for a rank forked from a zygote (world/_zygote.py): it
    # is written into the rank's own environment block before anything else runs.
    cookie: str | None = None


def stack_file(tmpdir: str | Path, rank: int) -> Path:
    return Path(tmpdir) / f"rank{rank}.stacks"


def arrive(store: Any, rank: int, world_size: int, poll_s: float = 0.005) -> None:
    """Wait on the store until every rank of the world has reached its rendezvous.

    Why before ``init_process_group``: gloo's connect waits for a peer's address only as long
    as the process-group timeout, and a chaos world's is seconds (short on purpose: it bounds
    collectives). A peer still importing torch on a loaded machine is not a hang, yet it failed
    the world's start ("wait timeout after 3200ms", seen under load). This wait has no timeout
    of its own: the supervisor's start clock (``World.start_timeout``) bounds it and kills a
    world whose ranks never all arrive. ``check`` never blocks, so a short poll is all it costs.
    """
    store.set(f"arrived/{rank}", b"1")
    keys = [f"arrived/{r}" for r in range(world_size)]
    while not store.check(keys):
        time.sleep(poll_s)


def _init_process_group(cfg: RankConfig) -> RankContext:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(cfg.threads)
    # torch reads TORCH_DISTRIBUTED_DEBUG once, when first imported, which in a spawned child
    # can happen before cfg.env is applied (the parent's __main__ is re-imported). Re-read it,
    # or DDP errors name parameter indices instead of parameter names.
    dist.set_debug_level_from_env()
    if cfg.backend == "nccl":
        assert cfg.device_index is not None, "an NCCL rank is always given its device"
        torch.cuda.set_device(cfg.device_index)
        device = torch.device("cuda", cfg.device_index)
    else:
        device = torch.device("cpu")
    store: Any
    if cfg.store_file is not None:
        # In a private network the supervisor's store is out of reach (another namespace's
        # loopback); a file in the world's temp dir needs no socket at all.
        store = dist.FileStore(cfg.store_file, cfg.world_size)
    else:
        store = dist.TCPStore(cfg.store_host, cfg.store_port, is_master=False,
                              timeout=timedelta(seconds=max(cfg.pg_timeout_s, 30)))
    prefixed = dist.PrefixStore(cfg.store_prefix, store)
    rendezvous = _serve_private_rendezvous(cfg, prefixed) if cfg.store_file is not None else None
    arrive(prefixed, cfg.rank, cfg.world_size)
    # The timeout bounds how long a collective may wait for a peer. The supervisor's deadline
    # is what protects the run; this only stops a stuck rank from waiting gloo's default 30 min.
    dist.init_process_group(cfg.backend, store=prefixed, rank=cfg.rank, world_size=cfg.world_size,
                            timeout=timedelta(seconds=cfg.pg_timeout_s))
    side = dist.new_group(backend="gloo") if cfg.backend != "gloo" else dist.group.WORLD
    return RankContext(rank=cfg.rank, world_size=cfg.world_size, backend=cfg.backend, device=device,
                       tmpdir=Path(cfg.tmpdir), generation=cfg.generation, local_rank=cfg.rank,
                       group=dist.group.WORLD, side_group=side, store=store,
                       pg_timeout_s=cfg.pg_timeout_s, rendezvous=rendezvous)


def _serve_private_rendezvous(cfg: RankConfig, store: Any) -> Any:
    """Rank 0 serves a TCPStore on the private network's loopback; every rank's MASTER_PORT
    names it. Returns the server on rank 0 (kept alive with the rank), None elsewhere.

    Why: a rank's MASTER_ADDR:MASTER_PORT must be its world's rendezvous, as in a torchrun
    worker (``env://`` in the user's code connects there), and in a private network the
    supervisor's store is another namespace's loopback, out of reach; the ranks themselves
    rendezvous through a file. The wildcard address TCPStore listens on is harmless here: the
    namespace's only interface is its own loopback. The port travels through the file store,
    whose ``get`` waits for rank 0 (bounded by the supervisor's start clock).
    """
    import torch.distributed as dist

    server = None
    if cfg.rank == 0:
        server = dist.TCPStore(LOOPBACK_HOST, 0, is_master=True, wait_for_workers=False,
                               timeout=timedelta(seconds=max(cfg.pg_timeout_s, 30)))
        store.set("master_port", str(server.port))
    os.environ["MASTER_PORT"] = store.get("master_port").decode()
    return server


def _error(exc: BaseException) -> RankError:
    return RankError(kind="exception", message=str(exc), exc_type=type(exc).__name__,
                     traceback="".join(traceback.format_exception(exc)))


def rank_main(cfg: RankConfig, conn: Any) -> None:
    """Entry point of a rank process (the target of multiprocessing's spawn, or of a zygote's fork)."""
    if cfg.cookie is not None:
        from ._zygote import adopt

        adopt(cfg.cookie)
    die_with_parent(cfg.parent_pid)
    try:
        os.setpgid(0, 0)
    except OSError:
        pass
    stacks = open(stack_file(cfg.tmpdir, cfg.rank), "a", buffering=1)
    faulthandler.enable(file=stacks, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=stacks, all_threads=True, chain=False)
    # The rank's environment, before any of the user's code runs: a torchrun worker's for this
    # world, nothing of another launcher's (_launch_env.py). A forked rank starts from its
    # zygote's environment and a spawned one from the supervisor's: launcher variables either
    # may hold are removed, not only overwritten (an srun's SLURM_PROCID has no counterpart).
    apply_environment(os.environ, cfg.env)
    # The platform's default start method, as in a rank that torchrun exec'd: spawn passes the
    # supervisor's on, and a DataLoader(num_workers=2) in the user's step would then spawn
    # workers that import torch afresh (seconds each, on every step's loader).
    multiprocessing.set_start_method(None, force=True)
    try:
        if cfg.netns is not None:
            # Before any socket exists: every thread gloo starts later inherits the namespace.
            join(cfg.netns)
        ctx = _init_process_group(cfg)
    except BaseException as exc:  # report instead of dying silently: the supervisor is waiting
        conn.send_bytes(encode("failed", NO_CALL, _error(exc)))
        return
    for module in cfg.preload:  # before "ready": on the start clock, never in a call's deadline
        try:
            importlib.import_module(module)
        except Exception:  # noqa: BLE001 - only a head start: the call that needs it raises
            pass
    conn.send_bytes(encode("ready", NO_CALL, os.getpid()))
    garbage = Collector()
    while True:
        try:
            message = decode(conn.recv_bytes())
        except (EOFError, OSError, ProtocolError):
            break  # the supervisor is gone (or garbled): nothing left to serve
        if message.kind != "call":
            break
        call_id = message.call_id
        fn, args, kwargs = message.payload
        start = time.perf_counter()
        try:
            value = fn(ctx, *args, **kwargs)
            result = RankResult(cfg.rank, value, time.perf_counter() - start, pid=os.getpid(),
                                hostname=ctx.hostname)
        except BaseException as exc:
            result = RankResult(cfg.rank, None, time.perf_counter() - start, error=_error(exc),
                                pid=os.getpid(), hostname=ctx.hostname)
        try:
            payload = encode("result", call_id, result)
        except Exception as exc:  # an unpicklable return value is the caller's bug; say so
            payload = encode("result", call_id, RankResult(cfg.rank, None, result.duration_s,
                                                           error=_error(exc), pid=os.getpid()))
        conn.send_bytes(payload)
        # The call's model may sit in a reference cycle (its hooks): freed now, not carried
        # into the next check (_garbage.py). After the send: the supervisor reads meanwhile.
        del message, fn, args, kwargs, result, payload
        value = None
        garbage.after_call()
    _shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    # Now, not at interpreter exit: a non-daemon thread the user's code started (an uploader, a
    # watchdog) would keep the rank alive past its stop, and atexit handlers run user code.
    os._exit(0)


def _shutdown() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        try:
            dist.destroy_process_group()
        except Exception:
            pass
