"""The lines a user sees: the plugin's ``[ddp]`` lines (rank 0 speaks for an attached run),
a long check's "still running" line, and, with --ddp-own-terminal, no pytest progress letters
nor its end-of-run repeat of an exception the CLI has already said."""

from __future__ import annotations

from typing import Any

import pytest

from .keys import KEPT_TMP
from .options import is_writer, own_terminal


@pytest.hookimpl(tryfirst=True)
def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config) -> tuple[str, str, str] | None:
    """With --ddp-own-terminal each check's outcome is said by its own line (the writer's): no
    progress letter (".", "F", "s") glued in front of it. The category still counts."""
    if not own_terminal(config):
        return None
    if report.when != "call" and report.passed:
        return "", "", ""  # a passed setup or teardown: pytest's own default, no letter
    return report.outcome, "", ""


class OwnTerminal:
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


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    kept = config.stash.get(KEPT_TMP, None)
    if kept:
        terminalreporter.write_line(f"[ddp] --keep-tmp: the session's temp dir is kept: {kept}")


def progress(config: pytest.Config, line: str) -> None:
    """A long check's "still running" line, from the session's meter thread while the item runs:
    output is captured then, so capture is lifted for the one line (a user watches the run)."""
    capman = config.pluginmanager.get_plugin("capturemanager")
    if capman is None:
        say(config, line)
        return
    with capman.global_and_fixture_disabled():
        say(config, line)


def say(config: pytest.Config, line: str) -> None:
    if own_terminal(config) and not is_writer(config):
        return  # under --ddp-attach with the suite's own terminal: rank 0 speaks for the run
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(printable(line))


def printable(text: str) -> str:
    """``text`` with lone surrogates escaped (a parameter name from non-UTF-8 bytes): the
    terminal's encoder would raise on them."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
