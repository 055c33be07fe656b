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

This module is the face pytest loads: it hands on the hooks and fixtures of the plugin's parts
(``conformance/_plugin/``, one concept each) and registers, in ``pytest_configure``, the
objects that act on this process's run: the report writer and the run verdict on the
controller alone, the own-terminal silencer where --ddp-own-terminal asks for it.
"""

from __future__ import annotations

import os

import pytest

from ._plugin.items import pytest_generate_tests, pytest_runtest_setup, run_case
from ._plugin.keys import RUN_REPORT, TARGET_ERROR
from ._plugin.options import MARKERS, is_writer, own_terminal, pytest_addoption, settings_from
from ._plugin.session import ddp_session, ddp_world
from ._plugin.terminal import OwnTerminal, pytest_report_teststatus, pytest_terminal_summary
from ._plugin.verdict import RunVerdict
from ._plugin.writer import ReportWriter
from .harness.registry import select

__all__ = ["RUN_REPORT", "TARGET_ERROR", "ddp_session", "ddp_world", "pytest_addoption", "pytest_configure",
           "pytest_generate_tests", "pytest_report_teststatus", "pytest_runtest_setup", "pytest_terminal_summary",
           "run_case", "settings_from"]


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
    if config.getoption("--ddp-report-dir", None) and is_writer(config):
        from ddp_conformance.reports.store import ReportDirBusy
        from ddp_conformance.reports.trust import UntrustedReportDir

        try:
            writer = ReportWriter(config)
        except (ReportDirBusy, UntrustedReportDir) as exc:
            # Another live run owns the dir, or another user could change it: a usage error.
            raise pytest.UsageError(str(exc)) from None
        config.pluginmanager.register(writer, "ddp-report-writer")
    if is_writer(config):  # the controller (rank 0 under --ddp-attach): pytest's exit status is its
        config.pluginmanager.register(RunVerdict(config), "ddp-run-verdict")
    if own_terminal(config):
        config.pluginmanager.register(OwnTerminal(config), "ddp-own-terminal")
