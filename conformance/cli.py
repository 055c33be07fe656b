"""ddp-conformance: will DDP train this model correctly and at speed here?

    ddp-conformance run                                  # built-in targets, gloo, 2 ranks, full suite
    ddp-conformance run --suite ci                       # the fast CI subset
    ddp-conformance run --target my_target.py --report-dir out/
    ddp-conformance run --backend nccl --world-size 8    # on a GPU node
    torchrun --standalone --nproc-per-node 2 -m conformance run --attach
    ddp-conformance report out/                          # re-render out/report.{md,html}
    ddp-conformance list                                 # every check id
    ddp-conformance --version

Exit codes: 0 ready, 1 not ready (a check failed), 2 usage or target error, 3 inconclusive.
The exit code comes from this run's own verdict, handed over in memory by the plugin's report
writer (never read back from the report dir, which other users may be able to change:
docs/report-dir.md), and from pytest's own status: an interrupted, crashed or unusable pytest
run is never 0. A report dir other users can write is refused (exit 2). SIGTERM is handled
like Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator, Mapping

from ddp_conformance.reports.verdict import EXIT_INCONCLUSIVE, EXIT_NOT_READY, EXIT_READY, EXIT_USAGE

from .harness.registry import CHECKS, SUITES, select
from .harness.timing import DEFAULT_DEADLINE_S, MAX_DEADLINE_S
from .harness.targets import BUILTINS

DEFAULT_REPORT_DIR = "./ddp-conformance-report"
#: The fastest interconnect --link-gbps accepts (per rank): beyond it the number is a typo.
MAX_LINK_GBPS = 10_000.0
SUITE_DIR = Path(__file__).resolve().parent / "suite"


class UsageError(Exception):
    """Bad input: printed as one line, exit code 2."""


class TargetRefused(UsageError):
    """The target failed its validation at the edge: exit 2, and the report files say so."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="ddp-conformance", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the suite and write a readiness report")
    run.add_argument("--target", default=None, help="target file, module or built-in name "
                     "(mlp, tied-lm, branchy, convbn, trainer); default: all built-in targets")
    run.add_argument("--backend", default="auto", help="auto | gloo | nccl (default auto)")
    run.add_argument("--world-size", type=int, default=None, help="ranks (default: GPUs for nccl, 2 for gloo)")
    run.add_argument("--suite", default="full", help="ci | full (default full)")
    run.add_argument("--checks", default=None, help="comma-separated check ids (see `list`)")
    run.add_argument("--report-dir", default=DEFAULT_REPORT_DIR, help=f"default {DEFAULT_REPORT_DIR}")
    run.add_argument("--deadline", type=float, default=DEFAULT_DEADLINE_S,
                     help=f"seconds a distributed call may take before it is a hang (default {DEFAULT_DEADLINE_S:g})")
    run.add_argument("--attach", action="store_true", help="run as one rank under torchrun/srun")
    run.add_argument("--link-gbps", type=float, default=None,
                     help="your interconnect per rank in Gbit/s: scaling-cliff projects your step on it "
                          "with its validated model, saying how far it extrapolates")
    run.add_argument("--junit-xml", default=None, metavar="PATH",
                     help="also write a JUnit XML file: one test case per (check, target), for CI "
                          "systems that read JUnit")
    run.add_argument("--compare-ddp", action="store_true",
                     help="run the target both ways, through its parallelize and through DDP, side by side")
    run.add_argument("--keep-tmp", action="store_true",
                     help="keep the run's temp dir (ddp-session-*) for debugging; its path is printed")
    run.add_argument("pytest_args", nargs="*", help="after --: extra pytest arguments")
    report = sub.add_parser("report", help="re-render report.md/html from DIR/results.jsonl")
    report.add_argument("dir")
    sub.add_parser("list", help="every check id with a one-line description")
    return parser


def _version() -> str:
    """This package's version and the torch it would run on, read from the installed
    distributions' metadata: importing torch would take seconds for one line."""
    from . import __version__

    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = "not installed"
    return f"ddp-conformance {__version__} (torch {torch})"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if getattr(args, "report_dir", None):
        # Resolved before anything runs: the report goes where the user named it, from where
        # the run started, whatever the working directory is later.
        args.report_dir = os.path.abspath(args.report_dir)
    previous = _terminate_as_interrupt()
    try:
        if args.command == "list":
            return _list()
        if args.command == "report":
            return _report(Path(args.dir))
        return _run(args)
    except UsageError as exc:
        print(f"ddp-conformance: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        # A second Ctrl-C that escaped pytest: the report (if any) is incomplete, never ready.
        print("ddp-conformance: interrupted; the run is inconclusive (its report, if any, is "
              "marked incomplete)", file=sys.stderr)
        return EXIT_INCONCLUSIVE
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _terminate_as_interrupt() -> Any:
    """SIGTERM (a CI runner cancelling a job, ``timeout``, ``kill``) takes the Ctrl-C path:
    ranks killed, report written as incomplete, exit 3. The plugin installs the same handler
    for the session, recording that the run was interrupted."""
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt("SIGTERM received")

    try:
        return signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread (main() called from a thread): leave it alone
        return None


def _list() -> int:
    width = max(len(spec.id) for spec in CHECKS)
    for spec in CHECKS:
        suites = ",".join(s for s in SUITES if s in spec.suites) or "opt-in"
        print(f"{spec.id:<{width}}  {spec.kind:<11} [{suites}]  {spec.description}")
    print(f"\nbuilt-in targets: {', '.join(BUILTINS)}")
    return EXIT_READY


def _report(directory: Path) -> int:
    """Re-render DIR's reports from its files. Not a verdict: the dir is checked as a run's
    is (ownership, mode, no links), and the output says the verdict is only as trustworthy
    as the dir (docs/report-dir.md)."""
    from ddp_conformance.reports.render import write_reports
    from ddp_conformance.reports.store import OWN_FILES, RESULTS
    from ddp_conformance.reports.trust import UntrustedReportDir, check_dir
    from ddp_conformance.reports.verdict import exit_code

    if not str(directory):
        raise UsageError("report needs the --report-dir of a run, not an empty path")
    missing = UsageError(f"{directory}/{RESULTS} does not exist; pass the --report-dir of a run")
    if not directory.is_dir():
        raise missing
    try:
        warning = check_dir(directory, OWN_FILES)
        if not (directory / RESULTS).is_file():  # no link any more (check_dir): what is there
            raise missing
        report = write_reports(directory)
    except UntrustedReportDir as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"cannot write the report into {str(directory)!r} ({exc.strerror or exc}); "
                         f"copy the directory somewhere writable and run `report` there") from None
    if warning:
        print(f"ddp-conformance: warning: {warning}", file=sys.stderr)
    print(f"verdict: {report['verdict']}{'' if report.get('complete', True) else ' (incomplete run)'}"
          f" — {directory}/report.html")
    print(f"note: a re-rendered verdict is only as trustworthy as {directory}: anyone who can write there "
          f"can change its records; the verdict of record is the run's own exit code")
    for reason in report.get("harness_errors", []):
        print(f"ddp-conformance: {reason}", file=sys.stderr)
    return exit_code(report["verdict"])


def _validate(args: argparse.Namespace) -> tuple[str, int]:
    """Reject bad input at the edge, before a single process starts. Returns (backend, world size)."""
    from .harness.targets import TargetError
    from .harness.world import WorldUnavailable
    from .harness.world.devices import check_world, default_world_size, resolve_backend

    if args.suite not in SUITES:
        raise UsageError(f"--suite {args.suite!r} is not one of {', '.join(SUITES)}")
    if args.checks is not None and not any(c.strip() for c in args.checks.split(",")):
        # "" or "," would otherwise mean "no filter" and silently run everything.
        raise UsageError(f"--checks {args.checks!r} names no check; pass check ids separated by "
                         f"commas (see `ddp-conformance list`), or leave --checks out")
    try:
        select(args.checks, args.suite)
        backend = resolve_backend(args.backend)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not (math.isfinite(args.deadline) and 0 < args.deadline <= MAX_DEADLINE_S):
        raise UsageError(f"--deadline {args.deadline:g} must be a positive number of seconds, "
                         f"finite and at most {MAX_DEADLINE_S:g} (default {DEFAULT_DEADLINE_S:g})")
    if args.link_gbps is not None and not (math.isfinite(args.link_gbps) and 0 < args.link_gbps <= MAX_LINK_GBPS):
        raise UsageError(f"--link-gbps {args.link_gbps:g} must be a positive number of Gbit/s, at most "
                         f"{MAX_LINK_GBPS:g} (e.g. 100 for 100 GbE, 400 for NDR InfiniBand)")
    if args.compare_ddp and args.target is None:
        raise UsageError("--compare-ddp needs --target: it runs that target through its parallelize "
                         "and through DDP, side by side")
    if args.world_size is not None and args.world_size < 1:
        raise UsageError(f"--world-size {args.world_size} must be at least 1")
    if not args.report_dir:
        raise UsageError("--report-dir '' is empty; pass a directory (default "
                         f"{DEFAULT_REPORT_DIR})")
    if args.junit_xml is not None:
        _check_junit_xml(args)
    for arg in args.pytest_args:
        if arg.startswith(("--ddp-", "--report-dir")):
            # A second report dir (or backend, target...) behind the CLI's back would make the
            # CLI read one directory while pytest writes another.
            raise UsageError(f"{arg.split('=')[0]} after -- would override ddp-conformance's own "
                             f"option; pass it as a ddp-conformance option before --")
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
    from .harness.exhaustion import open_files

    # Raised where it can be (`ulimit -n 16` aborted the run); under a launcher this process is
    # one rank, whatever the world's size.
    short = open_files(1 if args.attach else world_size)
    if short is not None:
        raise UsageError(short)
    _check_writable(Path(args.report_dir))
    if not args.attach or _launched_rank() == "0":  # under a launcher only rank 0 writes
        _own(Path(args.report_dir))
    if args.target is not None:
        from .harness.world.validate import validate_target

        try:
            # In a child, under the run's deadline: the target's import or build_model()
            # may hang, and the supervisor must not hang with it.
            validate_target(_target_arg(args.target), world_size, deadline=args.deadline,
                            launched=args.attach)
        except TargetError as exc:
            raise TargetRefused(str(exc)) from None
    return backend, world_size


def _check_junit_xml(args: argparse.Namespace) -> None:
    """--junit-xml PATH: a file pytest's junitxml plugin will write at the end of the run, so its
    folder must exist and be writable now (found at the end, a bad path would lose nothing of the
    report but would fail the CI step that reads the XML)."""
    path = os.path.abspath(args.junit_xml) if args.junit_xml else ""
    if not args.junit_xml or os.path.isdir(path):
        raise UsageError(f"--junit-xml {args.junit_xml!r} must name a file (e.g. ddp-junit.xml), "
                         f"not {'a directory' if args.junit_xml else 'an empty path'}")
    folder = os.path.dirname(path)
    if not os.path.isdir(folder) or not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"--junit-xml {args.junit_xml!r}: its folder {folder!r} does not exist or is not "
                         f"writable; create it or pass another path")
    args.junit_xml = path  # resolved where the run starts, as --report-dir is


def _launched_rank() -> str:
    return os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))


def _target_arg(target: str) -> str:
    """A file target travels as an absolute path (pytest runs from the suite's folder);
    built-in names win over same-named files or folders in the working directory."""
    if target not in BUILTINS and os.path.isfile(target):
        return str(Path(target).resolve())
    return target


def _check_writable(directory: Path) -> None:
    from ddp_conformance.reports.store import OWN_FILES
    from ddp_conformance.reports.trust import UntrustedReportDir, check_dir

    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--report-dir {str(directory)!r} is not writable ({exc.strerror}); "
                         f"pass a directory you can write to") from None
    try:
        # Before the probe writes there: a dir other users can write, or a link planted at
        # one of the run's names, is refused (docs/report-dir.md). Its warning is _own's to say.
        check_dir(directory, OWN_FILES)
    except UntrustedReportDir as exc:
        raise UsageError(str(exc)) from None
    try:
        # A probe of its own: under torchrun every rank probes the same (shared) dir, and
        # with one fixed name a rank could unlink the probe another rank was about to.
        fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=directory)
        try:
            # A few bytes, not an empty file: a full disk still creates empty files.
            os.write(fd, b"probe\n")
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as exc:
        raise UsageError(f"--report-dir {str(directory)!r} is not writable ({exc.strerror}); "
                         f"pass a directory you can write to") from None


def _own(directory: Path) -> None:
    """Lock the report dir for this run (held until the process exits); say why a dir its
    group can write is still used."""
    from ddp_conformance.reports.store import ReportDirBusy, ResultStore
    from ddp_conformance.reports.trust import UntrustedReportDir

    try:
        warning = ResultStore(directory).lock()
    except (ReportDirBusy, UntrustedReportDir) as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        raise UsageError(f"--report-dir {str(directory)!r} is not writable ({exc.strerror or exc}); "
                         f"pass a directory you can write to") from None
    if warning:
        print(f"ddp-conformance: warning: {warning}", file=sys.stderr)


def _plugin_args() -> list[str]:
    """Load the plugin by module only when its entry point is not installed (a source tree)."""
    try:
        names = {ep.name for ep in metadata.entry_points(group="pytest11")}
    except Exception:
        names = set()
    return [] if "ddp_conformance" in names else ["-p", "conformance.plugin"]


def _run(args: argparse.Namespace) -> int:
    import pytest

    from ddp_conformance.reports.store import new_run_id

    run_id = new_run_id()
    try:
        backend, world_size = _validate(args)
    except TargetRefused as exc:
        _report_target_error(args, run_id, str(exc))
        raise
    report_dir = Path(args.report_dir)
    argv = [
        str(SUITE_DIR), "-c", str(SUITE_DIR / "pytest.ini"), "--rootdir", str(SUITE_DIR),
        # The terminal is the product's (--ddp-own-terminal): one line per check and the verdict,
        # without pytest's progress letters, summaries, tracebacks or captured output.
        *_plugin_args(), "-qq", "-rN", "--tb=no", "--disable-warnings", "-o", "console_output_style=classic",
        "--ddp-own-terminal",
        "--ddp-backend", backend, "--ddp-world-size", str(world_size),
        "--ddp-deadline", str(args.deadline), "--ddp-report-dir", str(report_dir),
        "--ddp-suite", args.suite, "--ddp-run-id", run_id,
    ]
    if args.target is not None:
        argv += ["--ddp-target", _target_arg(args.target)]
    if args.checks:
        argv += ["--ddp-checks", args.checks]
    if args.attach:
        argv += ["--ddp-attach"]
    if args.keep_tmp:
        argv += ["--ddp-keep-tmp"]
    if args.compare_ddp:
        argv += ["--ddp-compare-ddp"]
    if args.link_gbps is not None:
        argv += ["--ddp-link-gbps", str(args.link_gbps)]
    if args.junit_xml is not None and (not args.attach or _launched_rank() == "0"):
        argv += [f"--junitxml={args.junit_xml}"]  # under a launcher rank 0 writes it, as the report
    argv += args.pytest_args
    stopped = _RunOutcome()
    with _isolated_from_user_pytest_config():
        code = pytest.main(argv, plugins=[stopped])
    if code == pytest.ExitCode.USAGE_ERROR:
        if stopped.message:  # a target error found while running: its one line, as at the edge
            print(f"ddp-conformance: error: {stopped.message}", file=sys.stderr)
        return EXIT_USAGE
    if code == pytest.ExitCode.INTERRUPTED and stopped.message:
        # The plugin stopped the run with its reason (under --attach: the launched world could
        # not be joined): one line, inconclusive.
        print(f"ddp-conformance: {stopped.message} (exit {EXIT_INCONCLUSIVE})", file=sys.stderr)
        return EXIT_INCONCLUSIVE
    if args.attach and _launched_rank() != "0":
        if code == pytest.ExitCode.OK:
            return EXIT_READY
        return EXIT_NOT_READY if code == pytest.ExitCode.TESTS_FAILED else EXIT_INCONCLUSIVE
    requested = [spec.id for spec in select(args.checks, args.suite, compare_ddp=args.compare_ddp)]
    return _verdict_exit(stopped.report, run_id, int(code), requested=requested, report_dir=report_dir)


def _report_target_error(args: argparse.Namespace, run_id: str, message: str) -> None:
    """The target refused at the edge: the report dir (owned by this run by now) gets report
    files saying so, in place of whatever an earlier run left there (a CI job uploads them
    whatever the exit code). Under a launcher only rank 0 writes; a dir that cannot be written
    changes nothing (exit 2 with the line stands)."""
    from ddp_conformance.reports.render import write_run_reports
    from ddp_conformance.reports.store import ResultStore

    if args.attach and _launched_rank() != "0":
        return
    store = ResultStore(args.report_dir)
    try:
        store.start({"run_id": run_id, "target": args.target, "suite": args.suite, "cwd": os.getcwd(),
                     "pid": os.getpid(), "target_error": message})
        store.finish()
        write_run_reports(store)
    except OSError:
        pass


#: Environment variables through which pytest takes options and plugins from outside its
#: command line. The gate's own run ignores them: ``PYTEST_ADDOPTS=--ddp-checks=X`` in a CI
#: job's environment once shrank ``run --suite ci`` to one check and came out ready.
_USER_PYTEST_ENV = ("PYTEST_ADDOPTS", "PYTEST_PLUGINS")


@contextlib.contextmanager
def _isolated_from_user_pytest_config() -> Iterator[None]:
    """The suite's pytest run sees only its own command line and ini file (``-c``, with
    ``--rootdir``: no pytest.ini, tox.ini, setup.cfg or pyproject.toml of the working
    directory applies); the environment's pytest options are set aside for the run."""
    saved = {name: os.environ.pop(name) for name in _USER_PYTEST_ENV if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


class _RunOutcome:
    """What the in-process pytest run hands back: the message of a ``pytest.exit`` (the
    plugin's exit on a target error) and this run's report, in memory."""

    message: str | None = None
    #: report.json's dict as the plugin's writer rendered it from memory; None if it wrote none.
    report: Mapping[str, Any] | None = None

    def pytest_keyboard_interrupt(self, excinfo: Any) -> None:
        self.message = getattr(excinfo.value, "msg", None)

    def pytest_unconfigure(self, config: Any) -> None:
        from .plugin import RUN_REPORT

        # The writer's own dict, never report.json read back: by now another user who can
        # write the dir may have replaced that file with a "ready" one.
        self.report = config.stash.get(RUN_REPORT, None)


#: pytest statuses after which the records can be trusted as far as they go; anything else
#: (interrupted, internal error, nothing collected) cannot yield a ready verdict.
_PYTEST_RAN = (0, 1)  # OK, TESTS_FAILED


def _verdict_exit(report: Mapping[str, Any] | None, run_id: str, pytest_code: int, *,
                  requested: list[str] | None = None, report_dir: Path) -> int:
    """The exit code from *this* run's report (the writer's in-memory dict), cross-checked
    with pytest's own status."""
    from ddp_conformance.reports import shorten_paths
    from ddp_conformance.reports.verdict import exit_code

    def inconclusive(why: str) -> int:
        print(f"ddp-conformance: {why}; the run is inconclusive (exit {EXIT_INCONCLUSIVE})",
              file=sys.stderr)
        return EXIT_INCONCLUSIVE

    if not isinstance(report, Mapping) or report.get("run_id") != run_id:
        # No report handed over (the dir could not be written), or one of another run.
        return inconclusive(f"this run (id {run_id}) wrote no report to {report_dir} "
                            f"(pytest exit status {pytest_code})")
    verdict = str(report.get("verdict"))
    try:
        code = exit_code(verdict)
    except ValueError:
        return inconclusive(f"report.json has no valid verdict ({verdict!r})")
    selected = report.get("checks_requested")
    if requested is not None and selected != requested and code != EXIT_NOT_READY:
        # The plugin ran another selection than the command line asked for (an option that
        # reached pytest from elsewhere): what was asked for was not all verified.
        return inconclusive(f"the run checked {', '.join(map(str, selected or [])) or 'nothing'} "
                            f"but {', '.join(requested)} was requested (a pytest option from "
                            f"outside the command line?); the report is in {report_dir}")
    if pytest_code not in _PYTEST_RAN and code != EXIT_NOT_READY:
        # A defect that was found stays found (1); anything else after an interrupted or
        # crashed pytest is undecided, whatever the records say.
        return inconclusive(f"pytest did not run to its end (exit status {pytest_code}); "
                            f"the {'incomplete ' if not report.get('complete') else ''}report is "
                            f"in {report_dir}")
    if code == EXIT_READY and pytest_code != 0:
        return inconclusive(f"pytest reported failures (exit status {pytest_code}) "
                            f"that no record explains")
    # Not ready: the first reason on the same line (a CI log shows why without the report).
    first = next(iter(report.get("reasons") or []), None) if code != EXIT_READY else None
    # Paths as the report files say them (relative to where the run started): the terminal
    # named the target once as the user typed it, and an absolute repeat here is noise.
    why = f": {' '.join(shorten_paths(str(first), report.get('cwd')).split())}" if first else ""
    print(f"ddp-conformance: verdict {verdict}{why} — {report_dir}/report.html, report.md, report.json")
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
