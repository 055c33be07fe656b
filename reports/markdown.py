"""report.md: the run at a glance, written to read well as a GitHub job summary.

Verdict first, then one table row per check, then the failures in detail with what to do
about them. GitHub rejects a step summary over 1 MiB and renders a table row with a stray
``|`` or newline as garbage, so every cell is escaped, long text is truncated with a note,
and the whole document is held under :data:`MAX_BYTES`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from tabulate import tabulate

from ._format import (
    DASH,
    STATUS_ICONS,
    title_of,
    cost_line,
    encodable,
    key_figure,
    lead,
    one_line,
    peak_memory,
    pretty_json,
    relative_path,
    seconds,
    shorten_paths,
    timestamp,
    truncate,
)
from .configuration import tables
from .node_table import HEADERS as NODE_HEADERS
from .node_table import node_tables
from .migration_table import HEADERS as MIGRATION_HEADERS
from .migration_table import migration_tables
from .recommend import recommend, verification, warnings_of

MAX_BYTES = 1_000_000  # GitHub's limit is 1 MiB per step summary; keep a margin
CELL_CHARS = 160
DETAIL_CHARS = 4_000
EVIDENCE_CHARS = 3_000
VERDICT_ICONS = {"ready": "🟢", "not-ready": "🔴", "inconclusive": "🟠", "node-healthy": "🟢"}
_CELL_SPECIALS = re.compile(r"([\\|`*_\[\]<>])")


def cell(value: Any, limit: int = CELL_CHARS) -> str:
    """One table cell: one line, at most ``limit`` characters, markdown and pipes escaped.

    Backslashes are escaped too, or ``\\|`` in a message would end the cell early.
    """
    text = one_line(value, limit)
    text = text.replace("&", "&amp;")
    return _CELL_SPECIALS.sub(lambda m: "\\" + m.group(1), text) or DASH


def text(value: Any) -> str:
    """Running text (not a table cell): same escaping, newlines kept as spaces."""
    return cell(" ".join(str(value).split()), limit=DETAIL_CHARS)


def fenced(body: str, lang: str = "") -> str:
    """A code block whose fence is longer than any backtick run inside it, so it cannot end early."""
    longest = max((len(run) for run in re.findall(r"`+", body)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{lang}\n{body}\n{fence}"


def _summary_line(report: Mapping[str, Any]) -> str:
    counts = report.get("counts")
    tally: Mapping[str, Any] = counts if isinstance(counts, Mapping) else {}
    parts = [f"{STATUS_ICONS.get(s, '')} {tally.get(s, 0)} {s}" for s in ("passed", "failed", "inconclusive", "skipped")]
    return " · ".join(parts)


def _header(report: Mapping[str, Any]) -> list[str]:
    verdict = str(report.get("verdict", "inconclusive"))
    title = cell(title_of(report))
    # The first reason in the headline: a verdict that is not ready says why in its first line.
    reasons = [shorten_paths(str(r), report.get("cwd")) for r in report.get("reasons") or []]
    first = next(iter(reasons), None)
    why = f" — {cell(first, 300)}" if first and verdict != "ready" else ""
    lines = [f"# {VERDICT_ICONS.get(verdict, '🟠')} DDP conformance: **{title}**{why}", ""]
    missing = _missing(report)
    if report.get("target_error"):
        lines += ["> [!CAUTION]", (f"> **Target error**: {text(str(report['target_error']))} — the run stopped at "
                                   "the target's own mistake: fix it and run again (exit code 2)."), ""]
    elif not report.get("complete", False):
        not_run = f" Not run: {', '.join(cell(m, 60) for m in missing)}." if missing else ""
        lines += ["> [!WARNING]", ("> **Incomplete run**: the run stopped before it finished (killed or crashed). "
                                   f"This report shows only the checks that completed.{not_run}"), ""]
    # A target error is said by the block above already: its reason is not repeated.
    for reason in reasons[1:] if report.get("target_error") else reasons:
        lines.append(f"- {text(reason)}")
    lines.append("")
    facts = [
        ("Target", shorten_paths(relative_path(report.get("target"), report.get("cwd")), report.get("cwd"))), ("Backend", report.get("backend")),
        ("World size", report.get("world_size")), ("Suite", report.get("suite")),
        ("Started", timestamp(report.get("started"))), ("Duration", seconds(report.get("duration_s"))),
    ]
    if report.get("startup_s") is not None:  # the worlds' start, outside every check's duration
        facts.append(("Start-up", seconds(report.get("startup_s"))))
    lines.append(" · ".join(f"**{k}:** {cell(v if v is not None else DASH, 80)}" for k, v in facts))
    lines += ["", _summary_line(report), ""]
    requested = report.get("checks_requested")
    if isinstance(requested, list):
        ran, missing = report.get("checks_run") or [], _missing(report)
        lines += [f"**Checks requested:** {cell(', '.join(map(str, requested)) or DASH, 400)} · "
                  f"**run:** {cell(', '.join(map(str, ran)) or DASH, 400)} · "
                  f"**missing:** {cell(', '.join(missing) or 'none', 400)}", ""]
    errors = report.get("harness_errors") or []
    if errors:
        lines += ["## Harness errors", ""] + [f"- {cell(e, 500)}" for e in errors[:50]]
        if len(errors) > 50:
            lines.append(f"- … and {len(errors) - 50} more (see report.json)")
        lines.append("")
    return lines


def _missing(report: Mapping[str, Any]) -> list[str]:
    """The selected checks that produced no result (report.json's ``missing_checks``)."""
    return [str(m) for m in report.get("missing_checks") or []]


def _not_run(report: Mapping[str, Any]) -> list[str]:
    """Every check that never ran, one per line: a partial run must say what it did not check."""
    missing = _missing(report)
    if not missing:
        return []
    why = ("the run stopped before them" if not report.get("complete", False)
           else "selected, but they produced no result (a harness error)")
    return [f"## Checks that did not run ({len(missing)})", "", f"_{why}; none of them counts as passed._", ""] \
        + [f"- ⏹️ {cell(m, 80)}" for m in missing] + [""]


def _targets(checks: list[Mapping[str, Any]], report: Mapping[str, Any]) -> list[str]:
    """Each check's target as the user typed it (relative to where the run started)."""
    return [relative_path(c.get("target") or report.get("target") or DASH, report.get("cwd")) for c in checks]


def _table(checks: list[Mapping[str, Any]], report: Mapping[str, Any]) -> list[str]:
    if not checks:
        return ["_No check produced a result._", ""]
    targets = _targets(checks, report)
    # One target: it is in the header already; a path repeated on every row only widens the table.
    several = len(set(targets)) > 1
    rows = []
    for c, target in zip(checks, targets):
        status = str(c.get("status"))
        rows.append([f"{STATUS_ICONS.get(status, '')} {cell(status, 20)}", cell(c.get("id"), 60),
                     *([cell(target, 60)] if several else []), cell(key_figure(c), 80),
                     cell(shorten_paths(str(c.get("message") or DASH), report.get("cwd"))),
                     cell(seconds(c.get("duration_s")), 20), cell(peak_memory(c), 40)])
    table = tabulate(rows, headers=["Status", "Check", *(["Target"] if several else []), "Key figure", "Evidence",
                                    "Time", "Peak RSS (supervisor / tree)"],
                     tablefmt="github", disable_numparse=True)
    return ["## Checks", "", table, ""]


def _node_health(checks: list[Mapping[str, Any]]) -> list[str]:
    """The per-rank health table of each node check, the named rank in bold."""
    lines = []
    for t in node_tables(checks):
        rows = [[f"**{cell(v, 120)}**" if named else cell(v, 120) for v in row] for row, named in zip(t.rows, t.named)]
        lines += [f"## Node health{f' ({cell(t.target, 80)})' if t.target else ''}", "",
                  tabulate(rows, headers=list(NODE_HEADERS), tablefmt="github", disable_numparse=True), ""]
    return lines


def _migration(checks: list[Mapping[str, Any]]) -> list[str]:
    """DDP beside the port (``--compare-ddp``): per rank, memory, step time, collectives; hazards."""
    lines = []
    for t in migration_tables(checks):
        rows = [[cell(v, 120) for v in row] for row in t.rows]
        lines += [f"## DDP migration{f' ({cell(t.target, 80)})' if t.target else ''}", "",
                  tabulate(rows, headers=list(MIGRATION_HEADERS), tablefmt="github", disable_numparse=True), ""]
        lines += [f"- ⚠️ {cell(h, 400)}" for h in t.hazards] + ([""] if t.hazards else [])
    return lines


def _configuration(report: Mapping[str, Any]) -> list[str]:
    """Per target: the features its step used, where, and what was verified with each."""
    lines = []
    for table in tables(report):
        rows = [[("✔️ " if r.used else "") + cell(r.feature, 40), cell(r.value, 80), cell(r.where, 120),
                 cell(r.verified, 300)] for r in table.rows]
        lines += [f"### Configuration of {cell(table.target, 120)}", "",
                  tabulate(rows, headers=["Feature", "Value", "Where found", "Verified with it"],
                           tablefmt="github", disable_numparse=True), ""]
    return (["## Configuration", "", "_Seen at run time on the ranks while your step ran._", ""] + lines
            if lines else [])


def _detail(c: Mapping[str, Any], cwd: Any = None) -> list[str]:
    status = str(c.get("status"))
    lines = [f"### {STATUS_ICONS.get(status, '')} {cell(c.get('id'), 80)} — {cell(c.get('title') or '', 120)}", ""]
    message, cut = truncate(shorten_paths(str(c.get("message") or ""), cwd), DETAIL_CHARS)
    if message.strip():
        lines += [fenced(message, "text"), ""]
        if cut:
            lines += [f"_Message truncated to {DETAIL_CHARS} characters; the full text is in report.json._", ""]
    lines += [f"_Cost: {cell(cost_line(c), 300)}._", ""]
    for warning in warnings_of(c)[:10]:
        lines.append(f"- ⚠️ {cell(warning, 300)}")
    advice = c.get("recommendation") or recommend(c)
    if advice:
        # Whether a re-run with the change fixed the failure (reports.recommend.verification).
        fix, more = lead(advice, 400)
        lines += ["", f"> **Recommendation:** **{text(fix)}**" + (f" {text(more)}" if more else ""), ">",
                  f"> _Verification: {text(verification({**c, 'recommendation': advice}) or '')}_", ""]
    evidence = c.get("evidence")
    if isinstance(evidence, Mapping) and evidence:
        body, cut = pretty_json(evidence, EVIDENCE_CHARS)
        note = " (truncated; full evidence in report.json)" if cut else ""
        lines += ["<details><summary>Evidence" + note + "</summary>", "", fenced(body, "json"), "", "</details>", ""]
    return lines


def _environment(report: Mapping[str, Any]) -> list[str]:
    env = report.get("environment")
    if not isinstance(env, Mapping) or not env:
        return []
    keys = ["torch", "cuda", "nccl", "driver", "gpu_count", "hostnames", "cpu_count", "backend", "world_size", "python"]
    rows = [[cell(k, 40), cell(json.dumps(env.get(k), default=str) if isinstance(env.get(k), list) else env.get(k), 200)]
            for k in keys if k in env]
    gpus = env.get("gpus")
    if isinstance(gpus, list) and gpus:
        names = sorted({str(g.get("name")) for g in gpus if isinstance(g, Mapping)})
        rows.append(["gpus", cell(", ".join(names), 200)])
    settings = env.get("settings")
    set_rows = []
    if isinstance(settings, list):
        for s in settings:
            if isinstance(s, Mapping):
                origin = "default" if s.get("default") else "**set**"
                set_rows.append([cell(s.get("name"), 60), cell(s.get("value"), 120), origin])
    lines = ["<details><summary>Environment</summary>", ""]
    if rows:
        lines += [tabulate(rows, headers=["Item", "Value"], tablefmt="github", disable_numparse=True), ""]
    if set_rows:
        lines += [tabulate(set_rows, headers=["Setting", "Value", "Origin"], tablefmt="github", disable_numparse=True), ""]
    return lines + ["</details>", ""]


def render(report: Mapping[str, Any]) -> str:
    """The markdown document for a report.json dict; always under :data:`MAX_BYTES` bytes."""
    report = encodable(report)
    checks = [c for c in report.get("checks") or [] if isinstance(c, Mapping)]
    lines = _header(report) + _table(checks, report) + _node_health(checks) + _migration(checks) + _configuration(report) + _not_run(report)
    failing = [c for c in checks if c.get("status") in ("failed", "inconclusive")]
    advised = [c for c in checks if c.get("status") not in ("failed", "inconclusive") and (warnings_of(c) or c.get("recommendation"))]
    if failing:
        lines += ["## Failures and inconclusive checks", ""]
        for c in failing:
            lines += _detail(c, report.get("cwd"))
    if advised:
        lines += ["## Other recommendations", ""]
        for c in advised:
            lines += _detail(c, report.get("cwd"))
    if checks:
        lines += ["## What each check cost", ""] + [
            f"- {cell(c.get('id'), 60)} on {cell(target, 60)}: "
            f"{cell(cost_line(c), 300)}" for c, target in zip(checks, _targets(checks, report))] + [""]
    events = report.get("events") or []
    if events:
        lines += [f"_{len(events)} fault injection / event record(s); see report.html for their timelines._", ""]
    lines += _environment(report)
    lines.append("_Generated by ddp-conformance; full data in report.json, charts in report.html._")
    return _fit("\n".join(lines) + "\n")


def _fit(doc: str) -> str:
    """Cut the document at a line boundary so it fits a GitHub job summary, with a note.

    A fence or ``<details>`` left open by the cut is closed, or the note would be swallowed.
    """
    if len(doc.encode("utf-8")) <= MAX_BYTES:
        return doc
    note = "\n> **Report truncated** to fit the 1 MiB job-summary limit; see report.json and report.html.\n"
    budget = MAX_BYTES - len(note.encode()) - 64
    kept: list[str] = []
    used = 0
    fence: str | None = None
    details = 0
    for line in doc.split("\n"):
        size = len(line.encode("utf-8")) + 1
        if used + size > budget:
            break
        kept.append(line)
        used += size
        run = re.match(r"^(`{3,})", line)
        if run and fence is None:
            fence = run.group(1)
        elif run and fence is not None and line.strip().strip("`") == "" and len(line.strip()) >= len(fence):
            fence = None
        elif fence is None:
            details += line.count("<details>") - line.count("</details>")
    tail = ([fence] if fence else []) + ["", "</details>"] * max(details, 0)
    return "\n".join(kept + tail) + "\n" + note
