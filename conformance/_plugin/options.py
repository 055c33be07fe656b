"""The plugin's command line (``--ddp-*``) and what it resolves to: the selected checks and
cases, the Settings a session runs with, how targets are named in lines, and which process
speaks and writes for the run."""

from __future__ import annotations

import os
from typing import Any

import pytest

from ..harness.registry import SUITES, select
from ..harness.timing import DEFAULT_DEADLINE_S

MARKERS = {
    "gpu": "needs CUDA GPUs and NCCL; skipped with a reason where there are none",
    "chaos": "injects faults (hangs, dead or slow ranks) into an isolated world",
    "slow": "takes more than a few seconds (sweeps, fresh worlds)",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ddp-conformance", "DDP conformance suite")
    group.addoption("--ddp-backend", default="auto", choices=("auto", "gloo", "nccl"),
                    help="process-group backend: nccl when >=2 GPUs are visible, else gloo (default auto)")
    group.addoption("--ddp-world-size", type=int, default=0,
                    help="ranks per world (default: GPU count for nccl, 2 for gloo)")
    group.addoption("--ddp-target", default=None,
                    help="target file, module or built-in name (default: the built-in targets)")
    group.addoption("--ddp-deadline", type=float, default=DEFAULT_DEADLINE_S,
                    help=f"seconds one distributed call may take before it is declared a hang (default {DEFAULT_DEADLINE_S:g})")
    group.addoption("--ddp-report-dir", default=None,
                    help="write results.jsonl and report.{json,md,html} here")
    group.addoption("--ddp-checks", default=None, help="comma-separated check ids (default: the suite's)")
    group.addoption("--ddp-suite", default="full", choices=SUITES, help="ci (fast subset) or full")
    group.addoption("--ddp-attach", action="store_true", default=False,
                    help="run as one rank of a torchrun/srun launch instead of spawning a world")
    group.addoption("--ddp-run-id", default=None,
                    help="the run id stamped on every record and on report.json (default: a new one)")
    group.addoption("--ddp-link-gbps", type=float, default=None,
                    help="the user's interconnect per rank (Gbit/s): scaling-cliff projects the step on it")
    group.addoption("--ddp-compare-ddp", action="store_true", default=False,
                    help="run the target both ways: through its parallelize and through DDP (its ddp_kwargs)")
    group.addoption("--ddp-keep-tmp", action="store_true", default=False,
                    help="keep the session's temp dir (ddp-session-*) for debugging")
    group.addoption("--ddp-own-terminal", action="store_true", default=False,
                    help="the terminal is the suite's: one line per check (a run's only target "
                         "named once) and no pytest progress characters; under --ddp-attach only "
                         "rank 0 prints (the ddp-conformance CLI sets it, with -qq --tb=no -rN)")


def own_terminal(config: pytest.Config) -> bool:
    return bool(config.getoption("--ddp-own-terminal", False))


def target_names(config: pytest.Config) -> dict[str, str]:
    """How each target spec of the run is named in its lines: a file relative to the folder the
    run started in (else as given); with --ddp-own-terminal, a run's only target is named once at
    the start and its lines leave it out (an empty name)."""
    from ..harness.session import Settings

    specs = list(dict.fromkeys(t for spec in selected(config)
                               for t in Settings(target=config.getoption("--ddp-target"),
                                                 compare_ddp=bool(config.getoption("--ddp-compare-ddp", False)),
                                                 ).targets_for(spec)))
    names = {t: relative(t) for t in specs}
    if own_terminal(config) and len(specs) == 1:
        return {specs[0]: ""}
    return names


def relative(spec: str) -> str:
    if os.path.isabs(spec):
        rel = os.path.relpath(spec)
        return spec if rel.startswith("..") else rel
    return spec


def on(config: pytest.Config, target: str) -> str:
    name = target_names(config).get(target, target)
    return f" on {name}" if name else ""


def is_writer(config: pytest.Config) -> bool:
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the controller writes
        return False
    if config.getoption("--ddp-attach"):
        return os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) == "0"
    return True


def settings_from(config: pytest.Config) -> Any:
    """Resolve options into Settings (imports torch to count GPUs; call from fixtures only)."""
    from ..harness.session import Settings
    from ..harness.world.attach import launcher_env
    from ..harness.world.devices import default_world_size, resolve_backend

    backend = resolve_backend(config.getoption("--ddp-backend"))
    world_size = config.getoption("--ddp-world-size") or 0
    attach = bool(config.getoption("--ddp-attach"))
    if attach:
        info = launcher_env()
        world_size = info["world_size"] if info else world_size
    world_size = world_size or default_world_size(backend)
    return Settings(backend=backend, world_size=world_size, deadline=config.getoption("--ddp-deadline"),
                    target=config.getoption("--ddp-target"), attach=attach,
                    keep_tmp=bool(config.getoption("--ddp-keep-tmp", False)),
                    link_gbps=config.getoption("--ddp-link-gbps", None),
                    suite=config.getoption("--ddp-suite", "full"),
                    compare_ddp=bool(config.getoption("--ddp-compare-ddp", False)))


def builtin_names() -> list[str]:
    from ..harness.targets import BUILTINS

    return list(BUILTINS)


def cases(config: pytest.Config) -> list[list[str]]:
    from ..harness.session import Settings

    settings = Settings(target=config.getoption("--ddp-target"),
                        compare_ddp=bool(config.getoption("--ddp-compare-ddp", False)))
    return [[spec.id, target] for spec in selected(config) for target in settings.targets_for(spec)]


def selected(config: pytest.Config) -> list[Any]:
    return select(config.getoption("--ddp-checks"), config.getoption("--ddp-suite"),
                  compare_ddp=bool(config.getoption("--ddp-compare-ddp", False)))
