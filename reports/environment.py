"""The environment fingerprint: what the run actually ran on, read from the running system.

A DDP verdict only holds for the stack it was measured on, so every report records the
versions (torch, CUDA, NCCL, driver), the devices, the hosts and the effective value of
every setting that changes DDP's behaviour on failure or its speed. Versions are read from
the live libraries (``torch.__version__``, ``torch.version.cuda``,
``torch.cuda.nccl.version()``, ``nvidia-smi``), never assumed. Works on a CPU-only machine:
what is absent is recorded as ``None``, and a probe that fails is noted in ``errors``
instead of failing the run.

torch is imported inside :func:`collect` only, so that rendering a report never needs it.
"""

from __future__ import annotations

import os
import platform
import shutil
import socket
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

# (name, default when unset, why it matters). Defaults are those of recent PyTorch / NCCL
# releases; the report marks them "default" so a reader knows they were not set explicitly.
IMPORTANT_SETTINGS: tuple[tuple[str, str, str], ...] = (
    ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3", "how a failed/timed-out collective tears down the process (3 = abort comms, skip cleanup)"),
    ("TORCH_NCCL_BLOCKING_WAIT", "0", "1 makes wait() block and raise on timeout (debugging only; slower)"),
    ("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000", "flight recorder ring size; 0 disables hang forensics"),
    ("TORCH_NCCL_DUMP_ON_TIMEOUT", "1", "dump the flight recorder when the watchdog times out"),
    ("TORCH_NCCL_ENABLE_MONITORING", "1", "monitor thread that aborts a stuck watchdog"),
    ("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "480", "seconds without watchdog heartbeat before abort"),
    ("TORCH_NCCL_DESYNC_DEBUG", "0", "report which rank desynchronised on a timeout"),
    ("TORCH_DISTRIBUTED_DEBUG", "OFF", "INFO/DETAIL add parameter names to DDP errors"),
    ("TORCH_CPP_LOG_LEVEL", "WARNING", "c10d C++ log verbosity"),
    ("TORCH_SHOW_CPP_STACKTRACES", "0", "C++ frames in Python exceptions"),
    ("NCCL_DEBUG", "(none)", "NCCL logging (WARN/INFO)"),
    ("NCCL_DEBUG_SUBSYS", "INIT,ENV", "NCCL subsystems logged when NCCL_DEBUG=INFO"),
    ("NCCL_SOCKET_IFNAME", "(auto)", "network interface for NCCL bootstrap and socket transport"),
    ("NCCL_IB_DISABLE", "0", "1 forces TCP sockets instead of InfiniBand/RoCE"),
    ("NCCL_IB_HCA", "(auto)", "which HCAs/ports NCCL uses"),
    ("NCCL_IB_GID_INDEX", "(auto)", "RoCE GID index (wrong value = no RoCE traffic)"),
    ("NCCL_IB_TIMEOUT", "20", "InfiniBand verbs timeout exponent"),
    ("NCCL_IB_RETRY_CNT", "7", "InfiniBand retry count"),
    ("NCCL_NET_GDR_LEVEL", "(auto)", "GPUDirect RDMA use by topology distance"),
    ("NCCL_P2P_DISABLE", "0", "1 disables NVLink/PCIe peer-to-peer (slow all-reduce)"),
    ("NCCL_SHM_DISABLE", "0", "1 disables shared-memory transport"),
    ("NCCL_ALGO", "(auto)", "forces Ring/Tree/...; NCCL otherwise picks per message size"),
    ("NCCL_PROTO", "(auto)", "forces LL/LL128/Simple protocol"),
    ("NCCL_MIN_NCHANNELS", "(auto)", "minimum channels (parallel rings)"),
    ("NCCL_BUFFSIZE", "4194304", "per-channel buffer size in bytes"),
    ("GLOO_SOCKET_IFNAME", "(auto)", "network interface for gloo"),
    ("OMP_NUM_THREADS", "(unset: torchrun sets 1)", "CPU threads per rank; oversubscription slows CPU ranks"),
    ("CUDA_VISIBLE_DEVICES", "(all)", "GPUs this process can see"),
    ("CUDA_LAUNCH_BLOCKING", "0", "1 serialises kernels (debugging only; very slow)"),
)
PREFIXES = ("TORCH_NCCL_", "TORCH_DISTRIBUTED_", "TORCH_FR_", "TORCH_CPP_", "NCCL_", "GLOO_", "TORCHELASTIC_", "OMP_")
LAUNCHER = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_JOB_ID")
_SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL")


def settings(environ: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Every DDP-relevant setting: the important ones (set or default) and any other set one.

    Each row is ``{"name", "value", "default": bool, "why"}``; ``default=True`` means the
    variable is unset and ``value`` is the library default.
    """
    env = os.environ if environ is None else environ
    rows: list[dict[str, Any]] = []
    known = set()
    for name, default, why in IMPORTANT_SETTINGS:
        known.add(name)
        if name in env:
            rows.append({"name": name, "value": _safe(name, env[name]), "default": False, "why": why})
        else:
            rows.append({"name": name, "value": default, "default": True, "why": why})
    for name in sorted(env):
        if name in known or not (name.startswith(PREFIXES) or name in LAUNCHER):
            continue
        rows.append({"name": name, "value": _safe(name, env[name]), "default": False, "why": ""})
    return rows


def _safe(name: str, value: str) -> str:
    return "(redacted)" if any(word in name.upper() for word in _SECRET_WORDS) else value


def nvidia_smi(timeout_s: float = 10.0) -> dict[str, Any] | None:
    """Driver version and GPU models as the driver reports them; ``None`` without nvidia-smi."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    query = [exe, "--query-gpu=driver_version,name,memory.total", "--format=csv,noheader,nounits"]
    # A wedged driver can make nvidia-smi hang; the fingerprint must never hold the run up.
    out = subprocess.run(query, capture_output=True, text=True, timeout=timeout_s, check=True).stdout
    gpus = []
    driver = None
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2:
            driver = parts[0]
            gpus.append({"name": parts[1], "memory_mib": _number(parts[2]) if len(parts) > 2 else None})
    return {"driver": driver, "gpus": gpus}


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _cpu_affinity() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def _torch_facts(errors: list[str]) -> dict[str, Any]:
    facts: dict[str, Any] = {"torch": None, "cuda": None, "cudnn": None, "nccl": None,
                             "cuda_available": False, "gpu_count": 0, "gpus": [],
                             "distributed_available": False, "nccl_available": False, "gloo_available": False}
    try:
        import torch
    except ImportError as exc:
        errors.append(f"torch not importable: {exc}")
        return facts
    facts["torch"] = torch.__version__
    facts["cuda"] = torch.version.cuda
    facts["hip"] = getattr(torch.version, "hip", None)
    try:
        facts["cudnn"] = torch.backends.cudnn.version()
    except Exception as exc:  # noqa: BLE001 - a probe must not fail the run
        errors.append(f"cudnn version: {exc}")
    try:
        facts["cuda_available"] = bool(torch.cuda.is_available())
        if facts["cuda_available"]:
            facts["gpu_count"] = torch.cuda.device_count()
            for index in range(facts["gpu_count"]):
                prop = torch.cuda.get_device_properties(index)
                facts["gpus"].append({"index": index, "name": prop.name,
                                      "memory_gib": round(prop.total_memory / 2**30, 1),
                                      "capability": f"{prop.major}.{prop.minor}"})
    except Exception as exc:  # noqa: BLE001
        errors.append(f"CUDA devices: {exc}")
    if facts["cuda"] is not None:
        try:
            version = torch.cuda.nccl.version()
            facts["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        except Exception as exc:  # noqa: BLE001 - CPU builds and some ROCm builds have no NCCL
            errors.append(f"NCCL version: {exc}")
    try:
        import torch.distributed as dist

        facts["distributed_available"] = bool(dist.is_available())
        if facts["distributed_available"]:
            facts["nccl_available"] = bool(dist.is_nccl_available())
            facts["gloo_available"] = bool(dist.is_gloo_available())
    except Exception as exc:  # noqa: BLE001
        errors.append(f"torch.distributed: {exc}")
    return facts


def collect(*, backend: str, world_size: int, hostnames: list[str] | None = None) -> dict[str, Any]:
    """The ``environment`` block of run.json/report.json (docs/architecture.md, 'Results').

    ``hostnames`` are the hosts of every rank when the launcher knows them (attach mode);
    the local host otherwise.
    """
    errors: list[str] = []
    hosts = sorted(set(hostnames)) if hostnames else [socket.gethostname()]
    env: dict[str, Any] = {
        "backend": backend,
        "world_size": int(world_size),
        "hostnames": hosts,
        "host_count": len(hosts),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "cpu_affinity": _cpu_affinity(),
    }
    env.update(_torch_facts(errors))
    try:
        smi = nvidia_smi()
    except (OSError, subprocess.SubprocessError) as exc:
        errors.append(f"nvidia-smi: {exc}")
        smi = None
    env["driver"] = smi["driver"] if smi else None
    if smi and not env["gpus"]:
        env["gpus"] = [{"index": i, **gpu} for i, gpu in enumerate(smi["gpus"])]
        env["gpu_count"] = len(smi["gpus"])
    env["settings"] = settings()
    env["errors"] = errors
    return env
