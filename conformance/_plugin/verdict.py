"""pytest's exit status follows the run's verdict: the same rule the CLI and the report files
say (``reports.verdict``), on the controller only."""

from __future__ import annotations

import time
from typing import Any

import pytest

from .keys import CASE_KEY, RUN_REPORT
from .options import cases, own_terminal, selected
from .records import case_result, finish_meta
from .terminal import say


class RunVerdict:
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
        _, record, harness_error = case_result(report)
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

            interrupted, extra = finish_meta(self.config, exitstatus, self.harness_errors)
            meta = {**extra, "checks_selected": [s.id for s in selected(self.config)],
                    "cases_selected": cases(self.config), "finished": None if interrupted else time.time()}
            built = build_report(meta, self.records, [])
            verdict, reasons = built["verdict"], built["reasons"]
        if not own_terminal(self.config):  # the CLI prints the verdict once, with its reason
            where = f" — report in {writer.store.dir}/report.html" if writer is not None else ""
            self._say(f"[ddp] verdict: {verdict}: {reasons[0] if reasons else ''}{where}")
        from ddp_conformance.reports.verdict import EXIT_CODES

        # Exit 0 only for a verdict whose exit code is 0 (ready; node-healthy for a node selection).
        if EXIT_CODES.get(str(verdict)) != 0 and session.exitstatus == pytest.ExitCode.OK:
            # pytest's "tests failed": a gate that reads only the exit status stops here, as it
            # does on the CLI's 1 or 3 (the CLI maps the verdict itself, so it is unchanged).
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def _say(self, line: str) -> None:
        say(self.config, line)
