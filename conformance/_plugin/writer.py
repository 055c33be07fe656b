"""The report writer, registered on the controller only (never a pytest-xdist worker, nor a
rank other than 0 under --ddp-attach): each record appended to DIR/results.jsonl the moment
its test report arrives, the report rendered at the end from what it wrote, in memory (the
report dir is not trusted: docs/report-dir.md)."""

from __future__ import annotations

import os
from typing import Any

import pytest

from .keys import HOSTNAMES, RUN_REPORT, STARTUP
from .options import builtin_names, cases, on, relative, selected, settings_from, target_names
from .records import case_result, finish_meta
from .terminal import say


class ReportWriter:
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
            "target": config.getoption("--ddp-target") or "built-in: " + ", ".join(builtin_names()),
            "backend": config.getoption("--ddp-backend"),
            "world_size": config.getoption("--ddp-world-size") or None,
            "suite": config.getoption("--ddp-suite"),
            "checks_selected": [s.id for s in selected(config)],
            # Every (check, target) item the run must produce a record for: one that produced
            # none (deselected, lost) makes the report list it as missing, never ready.
            "cases_selected": cases(config),
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
        only = [t for t, name in target_names(config).items() if not name]
        if only:  # named once here; each check's line then leaves it out
            self._say(f"[ddp] target: {relative(only[0])}")
        self._write(session, self.store.start, meta)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        events, record, harness_error = case_result(report)
        for event in events:
            self._write(self.session, self.store.append, event)
        if record is not None:
            self._write(self.session, self.store.append, record)
        if record is not None and harness_error is None:
            from ddp_conformance.reports import shorten_paths

            # A path in the message as the report files say it (relative to where the run
            # started): the target was named once, as typed, at the start.
            self._say(f"[ddp] {record.id}{on(self.config, str(record.target))}: {record.status.upper()} "
                      f"({record.duration_s:.1f} s) {shorten_paths(record.message, os.getcwd())}")
        if harness_error is not None:
            self.harness_errors.append(harness_error)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        interrupted, extra = finish_meta(self.config, exitstatus, self.harness_errors)
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
        # leaves the CLI with none, which it reads as inconclusive (and RunVerdict too).
        self.config.stash[RUN_REPORT] = report

    def _say(self, line: str) -> None:
        say(self.config, line)
