"""report.html: one self-contained page — verdict, what failed and what to do, checks, evidence, charts.

The first screen answers the reader's question: the verdict, then one card per failed or
inconclusive check with its cause and the one recommended fix (the first sentence of the
advice; the rest under it), the failed names in the verdict linking to those cards. Below:
the table of every check, grouped by target when a run had several (a target's path, relative
to where the run started, is said once, never on every row), the configuration, the
environment, and the evidence and charts per check. Text is cut only where a thought ends, and
never without a link or a fold to the whole of it.

One file with inline CSS and SVG and no external URL at all, so it opens offline, from a CI
artifact, or attached to a ticket. Jinja2 with autoescape on: every value from a check
(messages are arbitrary text, evidence arbitrary JSON) is escaped; only the SVG built by
:mod:`reports.charts`, which escapes its own text, is marked safe. The status filter is
CSS-only (radio buttons), so the page runs no script and cannot log a console error.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, select_autoescape

from ._format import (
    DASH,
    STATUS_ICONS,
    VERDICT_TITLES,
    title_of,
    cost_line,
    encodable,
    key_figure,
    lead,
    peak_memory,
    pretty_json,
    relative_path,
    seconds,
    shorten_paths,
    timestamp,
    truncate,
)
from .charts import charts_for
from .configuration import tables
from .recommend import recommend, verification, warnings_of
from .node_table import HEADERS as NODE_HEADERS
from .node_table import node_tables
from .migration_table import HEADERS as MIGRATION_HEADERS
from .migration_table import migration_tables
from .verdict import EXIT_CODES, USAGE

TEMPLATES = Path(__file__).parent / "templates"
MESSAGE_CHARS = 20_000
EVIDENCE_CHARS = 60_000
STATUS_ORDER = ("failed", "inconclusive", "passed", "skipped")
FAILING = ("failed", "inconclusive")
SUMMARY_CHARS = 200  # a table cell's evidence: where it ends, a link to the whole text
CAUSE_CHARS = 320  # a failure card's cause before the fold
FIX_CHARS = 400  # the one recommended fix: the advice's first sentence
ENV_FACTS = (("torch", "PyTorch"), ("cuda", "CUDA"), ("nccl", "NCCL"), ("driver", "Driver"), ("cudnn", "cuDNN"),
             ("gpu_count", "GPUs"), ("hostnames", "Hosts"), ("cpu_count", "CPUs"), ("cpu_affinity", "CPUs usable"),
             ("backend", "Backend"), ("world_size", "World size"), ("python", "Python"), ("platform", "Platform"))


@lru_cache(maxsize=1)
def _jinja() -> Environment:
    env = Environment(loader=FileSystemLoader(str(TEMPLATES)), autoescape=select_autoescape(default=True, default_for_string=True),
                      trim_blocks=True, lstrip_blocks=True)
    env.filters["seconds"] = seconds
    env.filters["timestamp"] = timestamp
    return env


def _slug(value: Any, index: int) -> str:
    return f"check-{index}-" + re.sub(r"[^a-zA-Z0-9_-]+", "-", str(value))[:60]


def _show(value: Any) -> str:
    if value is None or value == "":
        return DASH
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value) or DASH
    return str(value)


def _check_view(c: Mapping[str, Any], index: int, events: list[Any], default_target: Any, cwd: Any) -> dict[str, Any]:
    status = str(c.get("status")) if c.get("status") in STATUS_ICONS else "inconclusive"
    message, message_cut = truncate(shorten_paths(str(c.get("message") or ""), cwd), MESSAGE_CHARS)
    evidence = c.get("evidence")
    evidence_json, evidence_cut = pretty_json(evidence, EVIDENCE_CHARS) if isinstance(evidence, Mapping) and evidence else ("", False)
    own_events = [e for e in events if isinstance(e, Mapping) and e.get("check") == c.get("id")]
    advice = c.get("recommendation") or recommend(c)
    fix, fix_more = lead(shorten_paths(str(advice), cwd), FIX_CHARS) if advice else ("", "")
    summary, summary_more = lead(message, SUMMARY_CHARS)
    cause, cause_more = lead(message, CAUSE_CHARS)
    return {
        "anchor": _slug(c.get("id"), index), "failure_anchor": "failure-" + _slug(c.get("id"), index)[len("check-"):],
        "id": _show(c.get("id")), "title": _show(c.get("title")),
        "kind": _show(c.get("kind")), "status": status, "icon": STATUS_ICONS[status],
        "target": _show(relative_path(c.get("target") or default_target, cwd)), "key_figure": key_figure(c),
        "summary": summary or DASH, "summary_cut": bool(summary_more), "message": message, "message_cut": message_cut,
        "cause": cause, "cause_cut": bool(cause_more),
        "duration": seconds(c.get("duration_s")), "peak_memory": peak_memory(c), "cost": cost_line(c),
        "recommendation": advice, "fix": fix, "fix_more": fix_more,
        "verification": verification(c),
        "warnings": warnings_of(c), "evidence_json": evidence_json, "evidence_cut": evidence_cut,
        "charts": charts_for(c, events), "events": own_events,
    }


def _linked(reason: str, anchors: Mapping[str, str]) -> list[tuple[str, str | None]]:
    """``reason`` as (text, anchor) pieces: every check id it names (a failed or inconclusive
    one, whole word) links to that check's card; the rest is plain text."""
    if not anchors:
        return [(reason, None)]
    names = sorted(anchors, key=len, reverse=True)  # "a-b-c" before "a-b"
    pattern = re.compile(r"(?<![\w-])(" + "|".join(re.escape(n) for n in names) + r")(?![\w-])")
    pieces: list[tuple[str, str | None]] = []
    at = 0
    for match in pattern.finditer(reason):
        if match.start() > at:
            pieces.append((reason[at:match.start()], None))
        pieces.append((match.group(1), anchors[match.group(1)]))
        at = match.end()
    if at < len(reason):
        pieces.append((reason[at:], None))
    return pieces


def _groups(views: list[dict[str, Any]]) -> list[tuple[str, list[dict[str, Any]]]]:
    """The table's rows by target, in the order targets first appear: a path said once."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for v in views:
        groups.setdefault(v["target"], []).append(v)
    return list(groups.items())


def _environment(env: Any) -> tuple[list[tuple[str, str]], list[Mapping[str, Any]], list[str]]:
    if not isinstance(env, Mapping):
        return [], [], []
    facts = [(label, _show(env.get(key))) for key, label in ENV_FACTS if key in env]
    gpus = env.get("gpus")
    if isinstance(gpus, list) and gpus:
        names: dict[str, int] = {}
        for g in gpus:
            if isinstance(g, Mapping):
                names[str(g.get("name"))] = names.get(str(g.get("name")), 0) + 1
        facts.append(("GPU models", ", ".join(f"{n} × {name}" for name, n in names.items())))
    settings = [s for s in env.get("settings") or [] if isinstance(s, Mapping)]
    errors = [str(e) for e in env.get("errors") or []]
    return facts, settings, errors


def render(report: Mapping[str, Any]) -> str:
    """The HTML page for a report.json dict."""
    report = encodable(report)
    cwd = report.get("cwd")
    checks = [c for c in report.get("checks") or [] if isinstance(c, Mapping)]
    events = [e for e in report.get("events") or [] if isinstance(e, Mapping)]
    views = [_check_view(c, i, events, report.get("target"), cwd) for i, c in enumerate(checks)]
    tally = {s: sum(1 for v in views if v["status"] == s) for s in STATUS_ORDER}
    verdict = str(report.get("verdict")) if report.get("verdict") in VERDICT_TITLES else "inconclusive"
    facts, settings, env_errors = _environment(report.get("environment"))
    checked = {id(e) for v in views for e in v["events"]}
    failing = sorted((v for v in views if v["status"] in FAILING), key=lambda v: FAILING.index(v["status"]))
    anchors: dict[str, str] = {}
    for v in failing:
        anchors.setdefault(v["id"], v["failure_anchor"])
    groups = _groups(views)
    # "relative to" is said only where a path was shortened (a built-in target's name is not a path).
    named = [report.get("target"), *(c.get("target") for c in checks)]
    shortened = any(shorten_paths(relative_path(t, cwd), cwd) != str(t) for t in named if t is not None)
    return _jinja().get_template("report.html.j2").render(
        report=report, verdict=verdict, verdict_title=title_of(report),
        exit_code=EXIT_CODES[USAGE] if report.get("target_error") else EXIT_CODES[verdict],
        target_error=str(report.get("target_error") or ""),
        reasons=[_linked(shorten_paths(str(r), cwd), anchors) for r in report.get("reasons") or []], complete=bool(report.get("complete", False)),
        checks=views, failing=failing, groups=groups, several_targets=len(groups) > 1,
        target=shorten_paths(relative_path(report.get("target"), cwd), cwd), cwd=cwd if shortened else None,
        configuration=tables(report), node_health=node_tables(checks), node_headers=NODE_HEADERS,
        migration=migration_tables(checks), migration_headers=MIGRATION_HEADERS, tally=tally, statuses=STATUS_ORDER, facts=facts, settings=settings, env_errors=env_errors,
        harness_errors=[str(e) for e in report.get("harness_errors") or []],
        missing=[str(m) for m in report.get("missing_checks") or []],
        loose_events=[e for e in events if id(e) not in checked], all_events=events,
        started=timestamp(report.get("started")), duration=seconds(report.get("duration_s")),
        startup=seconds(report.get("startup_s")) if report.get("startup_s") is not None else None,
        show=_show,
    )
