"""ddp-conformance: will DDP train this model correctly and at speed here?

    ddp-conformance run                                  # built-in targets, gloo, 2 ranks, full suite
    ddp-conformance run --suite ci                       # the fast CI subset
    ddp-conformance run --target my_target.py --report-dir out/
    ddp-conformance run --backend nccl --world-size 8    # on a GPU node
    torchrun --standalone --nproc-per-node 2 -m conformance run --attach
    ddp-conformance report out/                          # re-render out/report.{md,html}
    ddp-conformance list                                 # every check id

Exit codes: 0 ready, 1 not ready (a check failed), 2 usage or target error, 3 inconclusive.
"""

from __future__ import annotations

import argparse
import os
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from reports.verdict import EXIT_INCONCLUSIVE, EXIT_NOT_READY, EXIT_READY, EXIT_USAGE

from .harness.registry import CHECKS, SUITES, select
from .harness.timing import DEFAULT_DEADLINE_S
from .harness.targets import BUILTINS

DEFAULT_REPORT_DIR = "./ddp-conformance-report"
SUITE_DIR = Path(__file__).resolve().parent / "suite"


class UsageError(Exception):
    """Bad input: printed as one line, exit code 2."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ddp-conformance", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the suite and write a readiness report")
    run.add_argument("--target", default=None, help="target file, module or built-in name "
                     "(mlp, tied-lm, branchy, convbn); default: all built-in targets")
    run.add_argument("--backend", default="auto", help="auto | gloo | nccl (default auto)")
    run.add_argument("--world-size", type=int, default=None, help="ranks (default: GPUs for nccl, 2 for gloo)")
    run.add_argument("--suite", default="full", help="ci | full (default full)")
    run.add_argument("--checks", default=None, help="comma-separated check ids (see `list`)")
    run.add_argument("--report-dir", default=DEFAULT_REPORT_DIR, help=f"default {DEFAULT_REPORT_DIR}")
    run.add_argument("--deadline", type=float, default=DEFAULT_DEADLINE_S,
                     help=f"seconds a distributed call may take before it is a hang (default {DEFAULT_DEADLINE_S:g})")
    run.add_argument("--attach", action="store_true", help="run as one rank under torchrun/srun")
    run.add_argument("pytest_args", nargs="*", help="after --: extra pytest arguments")
    report = sub.add_parser("report", help="re-render report.md/html from DIR/results.jsonl")
    report.add_argument("dir")
    sub.add_parser("list", help="every check id with a one-line description")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "list":
            return _list()
        if args.command == "report":
            return _report(Path(args.dir))
        return _run(args)
    except UsageError as exc:
        print(f"ddp-conformance: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _list() -> int:
    width = max(len(spec.id) for spec in CHECKS)
    for spec in CHECKS:
        suites = ",".join(s for s in SUITES if s in spec.suites)
        print(f"{spec.id:<{width}}  {spec.kind:<11} [{suites}]  {spec.description}")
    print(f"\nbuilt-in targets: {', '.join(BUILTINS)}")
    return EXIT_READY


def _report(directory: Path) -> int:
    from reports.render import write_reports
    from reports.verdict import exit_code

    if not (directory / "results.jsonl").exists():
        raise UsageError(f"{directory}/results.jsonl does not exist; pass the --report-dir of a run")
    report = write_reports(directory)
    print(f"verdict: {report['verdict']}{'' if report.get('complete', True) else ' (incomplete run)'}"
          f" — {directory}/report.html")
    return exit_code(report["verdict"])


def _validate(args: argparse.Namespace) -> tuple[str, int]:
    """Reject bad input at the edge, before a single process starts. Returns (backend, world size)."""
    from .harness.targets import TargetError
    from .harness.world import WorldUnavailable
    from .harness.world.devices import check_world, default_world_size, resolve_backend

    if args.suite not in SUITES:
        raise UsageError(f"--suite {args.suite!r} is not one of {', '.join(SUITES)}")
    try:
        select(args.checks, args.suite)
        backend = resolve_backend(args.backend)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.deadline <= 0:
        raise UsageError(f"--deadline {args.deadline:g} must be a positive number of seconds")
    if args.world_size is not None and args.world_size < 1:
        raise UsageError(f"--world-size {args.world_size} must be at least 1")
    if args.attach:
        from .harness.world.attach import launcher_env

        info = launcher_env()
        if info is None:
            raise UsageError("--attach needs a launcher: run it under torchrun or srun "
                             "(RANK and WORLD_SIZE are not set)")
        world_size = info["world_size"]
    else:
        world_size = args.world_size or default_world_size(backend)
        try:
            check_world(backend, world_size)
        except WorldUnavailable as exc:
            raise UsageError(str(exc)) from None
    _check_writable(Path(args.report_dir))
    if args.target is not None:
        try:
            _validate_target(args.target, world_size)
        except TargetError as exc:
            raise UsageError(str(exc)) from None
    return backend, world_size


def _validate_target(spec: str, world_size: int) -> None:
    import torch

    from .harness.targets import build_model_checked, load_target, make_batch_checked

    target = load_target(spec)
    torch.manual_seed(0)
    build_model_checked(target)
    size = target.batch_size_for(world_size)
    make_batch_checked(target, torch.Generator().manual_seed(0), size)


def _check_writable(directory: Path) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / ".write-probe"
        probe.write_text("")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"--report-dir {str(directory)!r} is not writable ({exc.strerror}); "
                         f"pass a directory you can write to") from None


def _plugin_args() -> list[str]:
    """Load the plugin by module only when its entry point is not installed (a source tree)."""
    try:
        names = {ep.name for ep in metadata.entry_points(group="pytest11")}
    except Exception:
        names = set()
    return [] if "ddp_conformance" in names else ["-p", "conformance.plugin"]


def _run(args: argparse.Namespace) -> int:
    import pytest

    backend, world_size = _validate(args)
    report_dir = Path(args.report_dir)
    argv = [
        str(SUITE_DIR), "-c", str(SUITE_DIR / "pytest.ini"), "--rootdir", str(SUITE_DIR),
        *_plugin_args(), "-q", "-rfEs",
        "--ddp-backend", backend, "--ddp-world-size", str(world_size),
        "--ddp-deadline", str(args.deadline), "--ddp-report-dir", str(report_dir),
        "--ddp-suite", args.suite,
    ]
    if args.target is not None:
        target = args.target
        # A file target travels as an absolute path (pytest runs from the suite's folder);
        # built-in names win over same-named files or folders in the working directory.
        if target not in BUILTINS and os.path.isfile(target):
            target = str(Path(target).resolve())
        argv += ["--ddp-target", target]
    if args.checks:
        argv += ["--ddp-checks", args.checks]
    if args.attach:
        argv += ["--ddp-attach"]
    argv += args.pytest_args
    stopped = _ExitMessage()
    code = pytest.main(argv, plugins=[stopped])
    if code == pytest.ExitCode.USAGE_ERROR:
        if stopped.message:  # a target error found while running: its one line, as at the edge
            print(f"ddp-conformance: error: {stopped.message}", file=sys.stderr)
        return EXIT_USAGE
    if args.attach and os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) != "0":
        return EXIT_READY if code == pytest.ExitCode.OK else EXIT_NOT_READY
    return _verdict_exit(report_dir)


class _ExitMessage:
    """Keeps the message of a ``pytest.exit`` (the plugin's exit on a target error)."""

    message: str | None = None

    def pytest_keyboard_interrupt(self, excinfo: Any) -> None:
        self.message = getattr(excinfo.value, "msg", None)


def _verdict_exit(report_dir: Path) -> int:
    import json

    from reports.verdict import exit_code

    try:
        report = json.loads((report_dir / "report.json").read_text())
    except (OSError, ValueError):
        print(f"ddp-conformance: no report was written to {report_dir}; the run is inconclusive",
              file=sys.stderr)
        return EXIT_INCONCLUSIVE
    print(f"ddp-conformance: verdict {report['verdict']} — {report_dir}/report.html, report.md, report.json")
    return exit_code(report["verdict"])


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
