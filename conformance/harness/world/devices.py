"""Which backend and devices a world gets on this machine.

GPUs are partitioned between pytest-xdist workers by slicing the visible device list, so
two workers never put two ranks on one GPU (NCCL does not support two ranks per device).
"""

from __future__ import annotations

import os

from ._results import WorldUnavailable

#: The most gloo ranks per CPU core a world may have. Each rank is a whole Python process
#: with torch (~1-2 s of CPU to start, ~200 MB); past 8 per core a world takes minutes to
#: start and its collectives time out on scheduling alone, so the run could not decide
#: anything. Refused up front with the fix instead.
MAX_GLOO_RANKS_PER_CORE = 8


def gpu_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _xdist_slot() -> tuple[int, int]:
    """(this worker's index, number of workers); (0, 1) outside pytest-xdist."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
    if worker.startswith("gw") and worker[2:].isdigit():
        return int(worker[2:]), max(count, 1)
    return 0, 1


def my_gpus() -> list[int]:
    """The device indices this process may use: all of them, or this xdist worker's slice."""
    total = gpu_count()
    index, workers = _xdist_slot()
    per = total // workers
    return list(range(index * per, (index + 1) * per))


def resolve_backend(backend: str) -> str:
    """``auto`` means nccl when at least two GPUs are visible, else gloo (the README's 'Command line')."""
    if backend == "auto":
        return "nccl" if gpu_count() >= 2 else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"--backend {backend!r} is not one of auto, gloo, nccl")
    return backend


def default_world_size(backend: str) -> int:
    return max(len(my_gpus()), 1) if backend == "nccl" else 2


def check_world(backend: str, world_size: int) -> list[int] | None:
    """Validate a (backend, world size) pair here; return the GPU indices for nccl.

    Raises WorldUnavailable with the fix in the message.
    """
    if world_size < 1:
        raise WorldUnavailable(f"--world-size {world_size} must be at least 1")
    if backend != "nccl":
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        if world_size > MAX_GLOO_RANKS_PER_CORE * cores:
            raise WorldUnavailable(
                f"world_size={world_size} gloo ranks cannot start on {cores} CPU core(s) "
                f"(at most {MAX_GLOO_RANKS_PER_CORE} per core); pass --world-size "
                f"{MAX_GLOO_RANKS_PER_CORE * cores} or fewer, or run on a larger machine")
        return None
    gpus = my_gpus()
    if not gpus:
        raise WorldUnavailable("--backend nccl needs GPUs but none are visible here; "
                               "use --backend gloo (CPU) or run on a GPU node")
    if world_size > len(gpus):
        raise WorldUnavailable(f"world_size={world_size} exceeds the {len(gpus)} visible GPUs; "
                               f"pass --world-size {len(gpus)} or --backend gloo")
    return gpus[:world_size]
