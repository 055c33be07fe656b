"""Results and reports of ddp-conformance: the schema, the streaming store, the verdict and
the renderers (report.json, report.md for GitHub job summaries, one self-contained
report.html). Nothing here imports torch, except :func:`collect_environment` when called.
"""

from __future__ import annotations

from ._format import shorten_paths
from .environment import collect as collect_environment
from .html import render as render_html
from .markdown import render as render_markdown
from .recommend import recommend
from .render import build_report, write_reports, write_run_reports
from .schema import KINDS, SCHEMA_VERSION, STATUSES, VERDICTS, CheckRecord, Event
from .store import ResultStore
from .trust import UntrustedReportDir
from .verdict import decide, exit_code

__all__ = [
    "KINDS",
    "SCHEMA_VERSION",
    "STATUSES",
    "VERDICTS",
    "CheckRecord",
    "Event",
    "ResultStore",
    "UntrustedReportDir",
    "build_report",
    "collect_environment",
    "decide",
    "exit_code",
    "recommend",
    "render_html",
    "render_markdown",
    "shorten_paths",
    "write_reports",
    "write_run_reports",
]
