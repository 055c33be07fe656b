"""pytest plugin of ddp-conformance (entry point ``pytest11: ddp_conformance``).

    pytest --pyargs conformance.suite --ddp-backend gloo --ddp-world-size 2 --ddp-report-dir out/
    pytest -n 2 --pyargs conformance.suite --ddp-checks gradient-equivalence
    torchrun --standalone --nproc-per-node 2 -m pytest --pyargs conformance.suite --ddp-attach

Import-light: loading this module imports neither torch nor the checks; a world starts only
when a test asks for one. Reports are written by the controller process only (never by a
pytest-xdist worker, nor by a rank other than 0 under --ddp-attach): workers attach each
check's record to its test report, and the controller appends it to results.jsonl the moment
that report arrives. The report dir is not trusted (docs/report-dir.md): the writer renders
the run's report from what it wrote, in memory, and leaves that dict in ``config.stash``
under :data:`RUN_REPORT`, where the CLI (same process) takes its exit code from.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from typing import Any, Iterator

import pytest

from .harness.registry import BY_ID, SUITES, select
from .harness.timing import DEFAULT_DEADLINE_S

RECORD_KEY = "ddp_record"
EVENTS_KEY = "ddp_events"
CASE_KEY = "ddp_case"
HOSTNAMES = pytest.StashKey[list]()
#: This run's report.json dict, as the writer rendered it from memory: the verdict of record.
RUN_REPORT = pytest.StashKey[dict]()
#: The target error that stopped the run (its one line), for the report files to say what it is.
TARGET_ERROR = pytest.StashKey[str]()
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
    group.addoption("--ddp-keep-tmp", action="store_true", default=False,
                    help="keep the session's temp dir (ddp-session-*) for debugging")
    group.addoption("--ddp-own-terminal", action="store_true", default=False,
                    help="the terminal is the suite's: one line per check (a run's only target "
                         "named once) and no pytest progress characters; under --ddp-attach only "
                         "rank 0 prints (the ddp-conformance CLI sets it, with -qq --tb=no -rN)")


def pytest_configure(config: pytest.Config) -> None:
    for name, text in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    checks = config.getoption("--ddp-checks", None)
    if checks is not None and not any(c.strip() for c in checks.split(",")):
        # "" or "," would otherwise mean "no filter" (everything) or parametrise nothing.
        raise pytest.UsageError(f"--ddp-checks {checks!r} names no check; pass check ids separated "
                                f"by commas, or leave the option out")
    try:  # reject a bad --ddp-checks before collection, as a usage error (exit 4)
        select(checks, config.getoption("--ddp-suite", "full"))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    if config.getoption("--ddp-report-dir", None):
        # Resolved now, before anything of the user's runs: the report goes where it was named.
        config.option.ddp_report_dir = os.path.abspath(config.getoption("--ddp-report-dir"))
    if config.getoption("--ddp-report-dir", None) and _is_writer(config):
        from ddp_conformance.reports.store import ReportDirBusy
        from ddp_conformance.reports.trust import UntrustedReportDir

        try:
            writer = _ReportWriter(config)
        except (ReportDirBusy, UntrustedReportDir) as exc:
            # Another live run owns the dir, or another user could change it: a usage error.
            raise pytest.UsageError(str(exc)) from None
        config.pluginmanager.register(writer, "ddp-report-writer")
    if _is_writer(config):  # the controller (rank 0 under --ddp-attach): pytest's exit status is its
        config.pluginmanager.register(_RunVerdict(config), "ddp-run-verdict")
    if _own_terminal(config):
        config.pluginmanager.register(_OwnTerminal(config), "ddp-own-terminal")


def _own_terminal(config: pytest.Config) -> bool:
    return bool(config.getoption("--ddp-own-terminal", False))


@pytest.hookimpl(tryfirst=True)
def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config) -> tuple[str, str, str] | None:
    """With --ddp-own-terminal each check's outcome is said by its own line (the writer's): no
    progress letter (".", "F", "s") glued in front of it. The category still counts."""
    if not _own_terminal(config):
        return None
    if report.when != "call" and report.passed:
        return "", "", ""  # a passed setup or teardown: pytest's own default, no letter
    return report.outcome, "", ""


class _OwnTerminal:
    """Registered with --ddp-own-terminal: the CLI says why a run stopped (a target error,
    Ctrl-C) in its own one line, so pytest's end-of-run repeat of the exception
    (``!!! _pytest.outcomes.Exit: ...`` or ``!!! KeyboardInterrupt !!!`` with a traceback line)
    is not printed. pytest offers no option against it: its terminal reporter's private
    ``_report_keyboardinterrupt`` is silenced on this one instance; a pytest without it prints
    the repeat, nothing else changes."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        reporter = self.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None and hasattr(reporter, "_report_keyboardinterrupt"):
            reporter._report_keyboardinterrupt = lambda: None


def _target_names(config: pytest.Config) -> dict[str, str]:
    """How each target spec of the run is named in its lines: a file relative to the folder the
    run started in (else as given); with --ddp-own-terminal, a run's only target is named once at
    the start and its lines leave it out (an empty name)."""
    from .harness.session import Settings

    specs = list(dict.fromkeys(t for spec in _selected(config)
                               for t in Settings(target=config.getoption("--ddp-target")).targets_for(spec)))
    names = {t: _relative(t) for t in specs}
    if _own_terminal(config) and len(specs) == 1:
        return {specs[0]: ""}
    return names


def _relative(spec: str) -> str:
    if os.path.isabs(spec):
        rel = os.path.relpath(spec)
        return spec if rel.startswith("..") else rel
    return spec


def _on(config: pytest.Config, target: str) -> str:
    name = _target_names(config).get(target, target)
    return f" on {name}" if name else ""


def _is_writer(config: pytest.Config) -> bool:
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the controller writes
        return False
    if config.getoption("--ddp-attach"):
        return os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")) == "0"
    return True


def settings_from(config: pytest.Config) -> Any:
    """Resolve options into Settings (imports torch to count GPUs; call from fixtures only)."""
    from .harness.session import Settings
    from .harness.world.attach import launcher_env
    from .harness.world.devices import default_world_size, resolve_backend

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
                    suite=config.getoption("--ddp-suite", "full"))


INTERRUPTED = pytest.StashKey[bool]()
KEPT_TMP = pytest.StashKey[str]()
STARTUP = pytest.StashKey[float]()


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    kept = config.stash.get(KEPT_TMP, None)
    if kept:
        terminalreporter.write_line(f"[ddp] --keep-tmp: the session's temp dir is kept: {kept}")


def _terminate_as_interrupt(config: pytest.Config) -> Any:
    """SIGTERM is handled like Ctrl-C: KeyboardInterrupt in the main thread, so the same path
    kills the ranks, writes an incomplete report and exits. Both are remembered: a run that
    was interrupted is never marked complete, even if pytest's own status says otherwise."""
    def handler(signum: int, frame: Any) -> None:
        config.stash[INTERRUPTED] = True
        raise KeyboardInterrupt(f"{signal.Signals(signum).name} received")

    if threading.current_thread() is not threading.main_thread():
        return None
    return {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}


@pytest.fixture(scope="session")
def ddp_session(pytestconfig: pytest.Config) -> Iterator[Any]:
    """The process's suite session: settings plus persistent worlds, closed at the end."""
    from .harness.root_cause import RootCauses
    from .harness.session import Session

    previous = _terminate_as_interrupt(pytestconfig)
    session = Session(settings_from(pytestconfig), progress=lambda line: _progress(pytestconfig, line),
                      label=lambda check_id, target: f"[ddp] {check_id}{_on(pytestconfig, target)}",
                      root_causes=RootCauses())
    try:
        session.prewarm(reference=any(spec.reference for spec in _selected(pytestconfig)))
        # The run's start-up, waited for before the first check so that check's time is its own.
        pytestconfig.stash[STARTUP] = round(session.ready(), 3)
        yield session
    finally:
        pytestconfig.stash[HOSTNAMES] = session.hostnames  # for the report, written after teardown
        try:
            session.close()
        finally:
            if session.settings.keep_tmp:  # said in the terminal summary (teardown output is captured)
                pytestconfig.stash[KEPT_TMP] = str(session.tmpdir)
            for sig, old in (previous or {}).items():
                signal.signal(sig, old)


@pytest.fixture(scope="session")
def ddp_world(ddp_session: Any) -> Any:
    """The persistent world for the configured backend and world size."""
    from .harness.world import WorldUnavailable

    try:
        return ddp_session.world()
    except WorldUnavailable as exc:
        pytest.skip(str(exc))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "ddp_case" not in metafunc.fixturenames:
        return
    config = metafunc.config
    from .harness.session import Settings

    settings = Settings(target=config.getoption("--ddp-target"))
    specs = select(config.getoption("--ddp-checks"), config.getoption("--ddp-suite"))
    params = []
    for spec in specs:
        marks = [getattr(pytest.mark, m) for m in spec.markers]
        if config.getoption("--ddp-backend") == "nccl":
            marks.append(pytest.mark.gpu)
        for target in settings.targets_for(spec):
            params.append(pytest.param((spec.id, target), id=f"{spec.id}:{target}", marks=marks))
    metafunc.parametrize("ddp_case", params)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "ddp_case" in callspec.params:
        check_id, target = callspec.params["ddp_case"]
        item.user_properties.append((CASE_KEY, json.dumps([check_id, target])))


def run_case(request: pytest.FixtureRequest, session: Any, check_id: str, target: str) -> None:
    """Run one check, attach its record to the test report, and turn its status into pytest's.

    Used by the suite's test function. ``inconclusive`` fails the pytest item (a CI gate must
    not go green on something it could not decide); the CLI's exit code keeps the nuance (3).
    """
    from .harness.targets import TargetError
    from .harness.world import LaunchedWorldUnreachable

    try:
        record, ctx = session.run_check(BY_ID[check_id], target)
    except TargetError as exc:
        request.config.stash[TARGET_ERROR] = str(exc)
        pytest.exit(f"target error: {exc}", returncode=pytest.ExitCode.USAGE_ERROR)
    except LaunchedWorldUnreachable as exc:  # under --attach: no check can run, stop at once
        pytest.exit(f"{exc}; nothing was verified, the run is inconclusive",
                    returncode=pytest.ExitCode.INTERRUPTED)
    events = [e.to_json() for e in (ctx.events if ctx else [])]
    request.node.user_properties.append((EVENTS_KEY, json.dumps(events)))
    request.node.user_properties.append((RECORD_KEY, json.dumps(record.to_json())))
    said = _printable(f"{check_id} on {target}: {record.message}")
    if record.status == "failed":
        pytest.fail(said, pytrace=False)
    if record.status == "inconclusive":
        pytest.fail(f"INCONCLUSIVE {said}", pytrace=False)
    if record.status == "skipped":
        pytest.skip(said)


class _ReportWriter:
    """Streams records to DIR/results.jsonl as they arrive and renders the report at the end."""

    def __init__(self, config: pytest.Config) -> None:
        from ddp_conformance.reports.store import ResultStore

        self.config = config
        self.store = ResultStore(config.getoption("--ddp-report-dir"))
        # One run per report dir, for the life of this process; a dir others can write is
        # refused here (UntrustedReportDir), a group-writable one is said at the session start.
        self.warning = self.store.lock()
        self.harness_errors: list[str] = []
        self.session: pytest.Session | None = None
        self.broken: str | None = None  # why the report dir could not be written (a full disk...)

    def _write(self, session: pytest.Session | None, action: Any, *args: Any, **kwargs: Any) -> None:
        """Write to the report dir; on an OS error stop the run: checks whose records cannot
        be kept prove nothing, and the CLI reads the missing report as inconclusive."""
        if self.broken:
            return
        try:
            action(*args, **kwargs)
        except OSError as exc:
            self.broken = f"cannot write to the report dir {str(self.store.dir)!r} ({exc.strerror or exc})"
            self._say(f"[ddp] {self.broken}; the run stops and is inconclusive")
            if session is not None:
                session.shouldstop = self.broken

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        config = self.config
        meta = {
            "target": config.getoption("--ddp-target") or "built-in: " + ", ".join(_builtin_names()),
            "backend": config.getoption("--ddp-backend"),
            "world_size": config.getoption("--ddp-world-size") or None,
            "suite": config.getoption("--ddp-suite"),
            "checks_selected": [s.id for s in _selected(config)],
            # Every (check, target) item the run must produce a record for: one that produced
            # none (deselected, lost) makes the report list it as missing, never ready.
            "cases_selected": _cases(config),
            "attach": bool(config.getoption("--ddp-attach")),
            "run_id": config.getoption("--ddp-run-id"),
            "pid": os.getpid(),
            # Where the user started the run: the report shows target paths relative to it.
            "cwd": os.getcwd(),
        }
        try:
            settings = settings_from(config)
            meta.update(backend=settings.backend, world_size=settings.world_size)
            from ddp_conformance.reports.environment import collect

            meta["environment"] = collect(backend=settings.backend, world_size=settings.world_size)
        except Exception as exc:  # the run goes on; the report says what could not be read
            meta["environment"] = {"error": f"{type(exc).__name__}: {exc}"}
        self.session = session
        if self.warning:
            self._say(f"[ddp] warning: {self.warning}")
        only = [t for t, name in _target_names(config).items() if not name]
        if only:  # named once here; each check's line then leaves it out
            self._say(f"[ddp] target: {_relative(only[0])}")
        self._write(session, self.store.start, meta)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        events, record, harness_error = _case_result(report)
        for event in events:
            self._write(self.session, self.store.append, event)
        if record is not None:
            self._write(self.session, self.store.append, record)
        if record is not None and harness_error is None:
            self._say(f"[ddp] {record.id}{_on(self.config, str(record.target))}: {record.status.upper()} "
                      f"({record.duration_s:.1f} s) {record.message}")
        if harness_error is not None:
            self.harness_errors.append(harness_error)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        interrupted, extra = _finish_meta(self.config, exitstatus, self.harness_errors)
        if self.broken:
            return
        if STARTUP in self.config.stash:  # absent on an xdist controller: its workers start worlds
            extra["startup_s"] = self.config.stash[STARTUP]
        hosts = self.config.stash.get(HOSTNAMES, [])
        if hosts:  # attach mode: the hosts of every rank, not only rank 0's
            environment = self.store.written()[0].get("environment") or {}
            extra["environment"] = {**environment, "hostnames": hosts}
        if interrupted:
            self._write(None, self.store.update_meta, **extra)  # not finished: incomplete
        else:
            self._write(None, self.store.finish, **extra)
        if self.broken:
            return
        from ddp_conformance.reports.render import write_run_reports

        try:
            # From memory, never read back: another user who can write the dir could have
            # rewritten results.jsonl by now (docs/report-dir.md).
            report = write_run_reports(self.store)
        except OSError as exc:
            self._say(f"[ddp] cannot write the report into {self.store.dir} ({exc.strerror or exc})")
            return
        # Handed over only once the files exist: a verdict whose report could not be written
        # leaves the CLI with none, which it reads as inconclusive (and _RunVerdict too).
        self.config.stash[RUN_REPORT] = report

    def _say(self, line: str) -> None:
        _say(self.config, line)


def _case_result(report: pytest.TestReport) -> tuple[list[Any], Any, str | None]:
    """What one test report of the suite brings: its events, its check's record, and the
    harness error when the check produced no record (a fixture or the world failed: the
    record made for it is inconclusive, so the run can never read as ready)."""
    from ddp_conformance.reports.schema import CheckRecord, Event

    props = {str(k): str(v) for k, v in report.user_properties}
    if RECORD_KEY in props and report.when == "call":
        events = [Event.from_json(data) for data in json.loads(props.get(EVENTS_KEY, "[]"))]
        return events, CheckRecord.from_json(json.loads(props[RECORD_KEY])), None
    if CASE_KEY in props and report.failed and RECORD_KEY not in props:
        check_id, target = json.loads(props[CASE_KEY])
        message = _first_line(report.longreprtext) or "harness error"
        spec = BY_ID[check_id]
        record = CheckRecord(id=check_id, title=spec.title, kind=spec.kind, status="inconclusive",
                             duration_s=report.duration, message=f"harness error: {message}", target=target,
                             evidence={"harness_error": report.longreprtext[-8000:]})
        return [], record, f"{check_id} on {target}: {message}"
    return [], None, None


def _finish_meta(config: pytest.Config, exitstatus: int, harness_errors: list[str]) -> tuple[bool, dict[str, Any]]:
    """Whether the run was cut short, and what its run.json gains at the end. Complete only
    when pytest itself ran to its end: a Ctrl-C (even a second one that pytest swallowed), an
    internal error, a usage error or nothing collected leaves it incomplete, never ready."""
    interrupted = (config.stash.get(INTERRUPTED, False)
                   or exitstatus not in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED))
    extra: dict[str, Any] = {"pytest_exit": int(exitstatus)}
    if harness_errors:
        extra["harness_error"] = "; ".join(harness_errors)
    if exitstatus == pytest.ExitCode.USAGE_ERROR:
        target_error = config.stash.get(TARGET_ERROR, None)
        if target_error:  # the files say what stopped the run, as stderr does
            extra["target_error"] = target_error
        else:
            extra["harness_error"] = "usage or target error; see the command output"
    return interrupted, extra


class _RunVerdict:
    """The pytest route's exit status follows the run's verdict, as the CLI's does (one rule,
    ``reports.verdict``): a run whose items all passed but that is not ready (a perf-only
    selection, a check --attach could not run) must not exit 0 in a CI job that gates on it.

    Registered on the controller only (rank 0 under --ddp-attach, never an xdist worker), and
    silent unless the suite's checks ran. The verdict is the report writer's (its in-memory
    report) when a report dir was named, else it is computed here from the same records in
    memory, without writing anything."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.records: list[Any] = []
        self.harness_errors: list[str] = []
        self.suite_ran = False  # an item of the suite's was reported: else this is not its run

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.suite_ran |= any(str(k) == CASE_KEY for k, _ in report.user_properties)
        _, record, harness_error = _case_result(report)
        if record is not None:
            self.records.append(record)
        if harness_error is not None:
            self.harness_errors.append(harness_error)

    @pytest.hookimpl(trylast=True)  # after the report writer's: its report is the verdict of record
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if not self.suite_ran:  # the user's own tests, with the plugin installed: not ours to judge
            return
        writer = self.config.pluginmanager.get_plugin("ddp-report-writer")
        if writer is not None:
            report = self.config.stash.get(RUN_REPORT, None)
            verdict, reasons = ((report["verdict"], report["reasons"]) if report is not None else
                                ("inconclusive", [writer.broken or "the run's report could not be written"]))
        else:
            from ddp_conformance.reports.render import build_report

            interrupted, extra = _finish_meta(self.config, exitstatus, self.harness_errors)
            meta = {**extra, "checks_selected": [s.id for s in _selected(self.config)],
                    "cases_selected": _cases(self.config), "finished": None if interrupted else time.time()}
            built = build_report(meta, self.records, [])
            verdict, reasons = built["verdict"], built["reasons"]
        if not _own_terminal(self.config):  # the CLI prints the verdict once, with its reason
            where = f" — report in {writer.store.dir}/report.html" if writer is not None else ""
            self._say(f"[ddp] verdict: {verdict}: {reasons[0] if reasons else ''}{where}")
        from ddp_conformance.reports.verdict import EXIT_CODES

        # Exit 0 only for a verdict whose exit code is 0 (ready; node-healthy for a node selection).
        if EXIT_CODES.get(str(verdict)) != 0 and session.exitstatus == pytest.ExitCode.OK:
            # pytest's "tests failed": a gate that reads only the exit status stops here, as it
            # does on the CLI's 1 or 3 (the CLI maps the verdict itself, so it is unchanged).
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _say(self, line: str) -> None:
        _say(self.config, line)


def _progress(config: pytest.Config, line: str) -> None:
    """A long check's "still running" line, from the session's meter thread while the item runs:
    output is captured then, so capture is lifted for the one line (a user watches the run)."""
    capman = config.pluginmanager.get_plugin("capturemanager")
    if capman is None:
        _say(config, line)
        return
    with capman.global_and_fixture_disabled():
        _say(config, line)


def _say(config: pytest.Config, line: str) -> None:
    if _own_terminal(config) and not _is_writer(config):
        return  # under --ddp-attach with the suite's own terminal: rank 0 speaks for the run
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(_printable(line))


def _printable(text: str) -> str:
    """``text`` with lone surrogates escaped (a parameter name from non-UTF-8 bytes): the
    terminal's encoder would raise on them."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _builtin_names() -> list[str]:
    from .harness.targets import BUILTINS

    return list(BUILTINS)


def _cases(config: pytest.Config) -> list[list[str]]:
    from .harness.session import Settings

    settings = Settings(target=config.getoption("--ddp-target"))
    return [[spec.id, target] for spec in _selected(config) for target in settings.targets_for(spec)]


def _selected(config: pytest.Config) -> list[Any]:
    return select(config.getoption("--ddp-checks"), config.getoption("--ddp-suite"))
