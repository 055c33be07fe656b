"""Same software everywhere, first: what each rank runs with, and where the ranks differ.

A bitwise disagreement between ranks needs no faulty device when the ranks run different
software or settings: another torch or cuDNN picks other kernels, another thread count splits
a CPU reduction differently, TF32 or the deterministic flags change the arithmetic. So each
rank's fingerprint is compared before its digests are judged, and a mismatch explains a
disagreement (inconclusive, with the mismatch) instead of naming a faulty rank.
"""

from __future__ import annotations

import os
from typing import Any

#: Environment prefixes whose variables change what collectives or kernels do.
ENV_PREFIXES = ("NCCL_", "TORCH_", "CUBLAS_", "CUDNN_", "OMP_", "MKL_")
#: Variables under those prefixes that differ between healthy ranks by design (per-rank
#: identities and ports the launcher hands out), left out of the comparison.
PER_RANK = ("TORCHELASTIC_ERROR_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCHELASTIC_RUN_ID")


def fingerprint(device: Any) -> dict[str, Any]:
    """This rank's software, devices and settings, as plain values (rank side)."""
    import torch

    cuda = getattr(device, "type", "cpu") == "cuda"
    out: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cudnn_deterministic": torch.backends.cudnn.deterministic,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "matmul_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_tf32": torch.backends.cudnn.allow_tf32,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "device_type": getattr(device, "type", "cpu"),
    }
    if cuda:
        props = torch.cuda.get_device_properties(device)
        out.update(device_name=props.name, capability=f"{props.major}.{props.minor}",
                   nccl=".".join(map(str, torch.cuda.nccl.version())),
                   driver=getattr(torch.cuda, "driver_version", lambda: None)())
    out["env"] = {k: v for k, v in sorted(os.environ.items())
                  if k.startswith(ENV_PREFIXES) and k not in PER_RANK}
    return out


def _flat(fp: dict[str, Any]) -> dict[str, Any]:
    flat = {k: v for k, v in fp.items() if k != "env"}
    flat.update({f"${k}": v for k, v in (fp.get("env") or {}).items()})
    return flat


def mismatches(fingerprints: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each setting whose value is not the same on every rank: its name and the ranks per value
    (``$NAME`` for an environment variable; an unset variable is ``None``)."""
    flats = [_flat(fp) for fp in fingerprints]
    keys = sorted({k for f in flats for k in f})
    out = []
    for key in keys:
        by_value: dict[str, list[int]] = {}
        for rank, f in enumerate(flats):
            by_value.setdefault(repr(f.get(key)), []).append(rank)
        if len(by_value) > 1:
            out.append({"setting": key, "values": {v: ranks for v, ranks in by_value.items()}})
    return out


def describe(found: list[dict[str, Any]], *, limit: int = 4) -> str:
    """``threads: 1 on ranks [0, 1], 2 on rank [2]; ...`` for a message."""
    parts = []
    for m in found[:limit]:
        values = "; ".join(f"{v} on ranks {r}" for v, r in m["values"].items())
        parts.append(f"{m['setting']} ({values})")
    more = f" and {len(found) - limit} more" if len(found) > limit else ""
    return ", ".join(parts) + more
