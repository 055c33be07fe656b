"""The environment fingerprint on this (GPU-less) machine, read from the live libraries."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_conformance.reports import environment


def _visible_gpus() -> int:
    """The GPUs this machine exposes, asked without the module under test: torch's count where
    CUDA works, else the driver's own list (``nvidia-smi -L``, one line a GPU), else none."""
    import torch

    if torch.cuda.is_available():
        return torch.cuda.device_count()
    if shutil.which("nvidia-smi") is None:
        return 0
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=True)
    return sum(line.startswith("GPU ") for line in listed.stdout.splitlines())


def test_collect_reads_the_running_versions() -> None:
    import torch

    env = environment.collect(backend="gloo", world_size=2)
    assert env["torch"] == torch.__version__
    assert env["cuda"] == torch.version.cuda
    assert env["backend"] == "gloo" and env["world_size"] == 2
    assert env["cpu_count"] and env["hostnames"] and env["host_count"] == 1
    assert env["gpu_count"] == len(env["gpus"]) == _visible_gpus(), env["gpus"]
    json.dumps(env, allow_nan=False)  # strict JSON, it goes into run.json


def test_gpus_the_driver_lists_but_torch_cannot_use_are_counted(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU build of torch on a GPU node: the driver's GPUs are the node's, counted and listed."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("torch sees this machine's GPUs: their count comes from torch, not the driver")
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho '550.90.07, NVIDIA H100 80GB HBM3, 81559'\n"
                    "echo '550.90.07, NVIDIA H100 80GB HBM3, 81559'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    env = environment.collect(backend="nccl", world_size=2)
    assert env["gpu_count"] == 2 and env["driver"] == "550.90.07"
    assert [(g["index"], g["name"], g["memory_mib"]) for g in env["gpus"]] == \
        [(0, "NVIDIA H100 80GB HBM3", 81559), (1, "NVIDIA H100 80GB HBM3", 81559)]


def test_hostnames_of_every_rank_are_deduplicated() -> None:
    env = environment.collect(backend="nccl", world_size=4, hostnames=["b", "a", "b", "a"])
    assert env["hostnames"] == ["a", "b"] and env["host_count"] == 2


def test_settings_mark_defaults_and_list_every_set_variable() -> None:
    rows = environment.settings({"NCCL_DEBUG": "INFO", "NCCL_IB_HCA": "mlx5_0", "TORCH_NCCL_FOO": "1",
                                 "PATH": "/bin", "NCCL_AUTH_TOKEN": "hunter2"})
    by_name = {r["name"]: r for r in rows}
    assert by_name["NCCL_DEBUG"] == {**by_name["NCCL_DEBUG"], "value": "INFO", "default": False}
    assert by_name["TORCH_NCCL_ASYNC_ERROR_HANDLING"]["default"] is True
    assert by_name["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"]["value"] == "480"
    assert by_name["TORCH_NCCL_FOO"]["value"] == "1"  # unknown but relevant prefix: listed
    assert "PATH" not in by_name
    assert by_name["NCCL_AUTH_TOKEN"]["value"] == "(redacted)"
    for required in ("TORCH_NCCL_BLOCKING_WAIT", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DUMP_ON_TIMEOUT",
                     "TORCH_NCCL_ENABLE_MONITORING", "TORCH_DISTRIBUTED_DEBUG", "NCCL_SOCKET_IFNAME",
                     "NCCL_P2P_DISABLE", "NCCL_ALGO", "NCCL_PROTO", "GLOO_SOCKET_IFNAME", "OMP_NUM_THREADS"):
        assert required in by_name


def test_nvidia_smi_absent_is_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(environment.shutil, "which", lambda name: None)
    assert environment.nvidia_smi() is None
    assert environment.collect(backend="gloo", world_size=1)["driver"] is None


def test_a_hanging_nvidia_smi_is_an_error_not_a_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    def slow(*args: object, **kwargs: object) -> None:
        raise subprocess.TimeoutExpired(cmd="nvidia-smi", timeout=10)

    monkeypatch.setattr(environment.shutil, "which", lambda name: "/usr/bin/nvidia-smi")
    monkeypatch.setattr(environment.subprocess, "run", slow)
    env = environment.collect(backend="gloo", world_size=1)
    assert env["driver"] is None and any("nvidia-smi" in e for e in env["errors"])


def test_reports_package_never_imports_torch() -> None:
    code = ("import sys, tempfile; from ddp_conformance import reports; from tests.reports.sample import write_sample_run; "
            "d = tempfile.mkdtemp(); write_sample_run(d); reports.write_reports(d); "
            "assert 'torch' not in sys.modules, 'reports imported torch'")
    # From the repository root: the sample run is a test fixture (tests/reports/sample.py).
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, cwd=Path(__file__).resolve().parents[2])
