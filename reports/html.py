"""report.html: one self-contained page — verdict, environment, checks, evidence, charts.

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
    cost_line,
    encodable,
    key_figure,
    one_line,
    peak_memory,
    pretty_json,
    seconds,
    timestamp,
    truncate,
)
from .charts import charts_for
from .configuration import tables
from .recommend import recommend, verification, warnings_of
from .verdict import EXIT_CODES

TEMPLATES = Path(__file__).parent / "templates"
MESSAGE_CHARS = 20_000
EVIDENCE_CHARS = 60_000
STATUS_ORDER = ("failed", "inconclusive", "passed", "skipped")
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


def _check_view(c: Mapping[str, Any], index: int, events: list[Any], default_target: Any) -> dict[str, Any]:
    status = str(c.get("status")) if c.get("status") in STATUS_ICONS else "inconclusive"
    message, message_cut = truncate(c.get("message") or "", MESSAGE_CHARS)
    evidence = c.get("evidence")
    evidence_json, evidence_cut = pretty_json(evidence, EVIDENCE_CHARS) if isinstance(evidence, Mapping) and evidence else ("", False)
    own_events = [e for e in events if isinstance(e, Mapping) and e.get("check") == c.get("id")]
    return {
        "anchor": _slug(c.get("id"), index), "id": _show(c.get("id")), "title": _show(c.get("title")),
        "kind": _show(c.get("kind")), "status": status, "icon": STATUS_ICONS[status],
        "target": _show(c.get("target") or default_target), "key_figure": key_figure(c),
        "summary": one_line(message, 240) or DASH, "message": message, "message_cut": message_cut,
        "duration": seconds(c.get("duration_s")), "peak_memory": peak_memory(c), "cost": cost_line(c), "recommendation": c.get("recommendation") or recommend(c),
        "verification": verification(c),
        "warnings": warnings_of(c), "evidence_json": evidence_json, "evidence_cut": evidence_cut,
        "charts": charts_for(c, events), "events": own_events,
    }


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
    checks = [c for c in report.get("checks") or [] if isinstance(c, Mapping)]
    events = [e for e in report.get("events") or [] if isinstance(e, Mapping)]
    views = [_check_view(c, i, events, report.get("target")) for i, c in enumerate(checks)]
    tally = {s: sum(1 for v in views if v["status"] == s) for s in STATUS_ORDER}
    verdict = str(report.get("verdict")) if report.get("verdict") in VERDICT_TITLES else "inconclusive"
    facts, settings, env_errors = _environment(report.get("environment"))
    checked = {id(e) for v in views for e in v["events"]}
    return _jinja().get_template("report.html.j2").render(
        report=report, verdict=verdict, verdict_title=VERDICT_TITLES[verdict], exit_code=EXIT_CODES[verdict],
        reasons=[str(r) for r in report.get("reasons") or []], complete=bool(report.get("complete", False)),
        checks=views, configuration=tables(report), tally=tally, statuses=STATUS_ORDER, facts=facts, settings=settings, env_errors=env_errors,
        harness_errors=[str(e) for e in report.get("harness_errors") or []],
        missing=[str(m) for m in report.get("missing_checks") or []],
        loose_events=[e for e in events if id(e) not in checked], all_events=events,
        started=timestamp(report.get("started")), duration=seconds(report.get("duration_s")),
        show=_show,
    )
