"""Small text helpers shared by the markdown and HTML renderers.

Everything here takes untrusted values (a check's message may be 1 MB of stack trace, a
metric may be a string where a float was expected) and returns short, plain text. Escaping
for the output format is the renderer's job, not this module's.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from .keys import (
    BEST_BUCKET_CAP_MB,
    CONFIGURED_BUCKET_CAP_MB,
    CULPRIT_RANK,
    MODEL_BYTES,
    MODEL_PARAMETERS,
    SUPERVISOR_PEAK_RSS,
    TREE_PEAK_RSS,
)

DASH = "—"
STATUS_ICONS = {"passed": "✅", "failed": "❌", "inconclusive": "⚠️", "skipped": "⏭️"}
VERDICT_TITLES = {"ready": "READY", "not-ready": "NOT READY", "inconclusive": "INCONCLUSIVE",
                  "node-healthy": "NODE HEALTHY"}
#: A run the target's own mistake stopped (exit 2): its files say so, not "inconclusive".
TARGET_ERROR_TITLE = "TARGET ERROR"


def title_of(report: Mapping[str, Any]) -> str:
    """The word a report leads with: the verdict's, or TARGET ERROR where the target stopped the
    run (report.json keeps ``verdict`` inconclusive, as nothing was decided, and says why in
    ``target_error``)."""
    if report.get("target_error"):
        return TARGET_ERROR_TITLE
    verdict = str(report.get("verdict", "inconclusive"))
    return VERDICT_TITLES.get(verdict, verdict)


def encodable(value: Any) -> Any:
    """``value`` with every string made encodable as UTF-8: a lone surrogate (a parameter name
    or message decoded from bytes that are not UTF-8, ``os.fsdecode`` of a path) becomes its
    escape (``\\udc80``), so no renderer crashes on it. Dicts and lists are walked; the rest
    is returned as is."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
            return value
        except UnicodeEncodeError:
            return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {encodable(k): encodable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [encodable(v) for v in value]
    return value


def truncate(text: Any, limit: int) -> tuple[str, bool]:
    """``text`` cut to ``limit`` characters, and whether it was cut."""
    text = "" if text is None else str(text)
    if len(text) <= limit:
        return text, False
    return text[: max(limit - 1, 0)] + "…", True


#: Where a long text may be cut so that what is shown ends a thought: a sentence, a " -- "
#: (a check's "what failed -- how it failed"), a clause, a list item; a word as the last resort.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(\"'])")
_CLAUSE_ENDS = (" -- ", " — ", "; ", ": ", ", ")


def lead(text: Any, limit: int) -> tuple[str, str]:
    """``text`` split into what to show first and the rest (``""`` when nothing is left).

    The first sentence when it fits ``limit`` characters; else the text cut at the last
    clause boundary before ``limit`` (a word boundary as the last resort), never mid-word. A
    reader shown the lead must be given a way to the rest: the renderers link or fold it.
    """
    text = " ".join(("" if text is None else str(text)).split())
    if len(text) <= limit and not _SENTENCE_END.search(text):
        return text, ""
    first = _SENTENCE_END.split(text, maxsplit=1)
    if len(first[0]) <= limit:
        return first[0], first[1] if len(first) > 1 else ""
    window = text[:limit]
    for mark in _CLAUSE_ENDS:
        at = window.rfind(mark)
        if at >= limit // 3:
            return window[:at].rstrip(), text[at + len(mark):].strip()
    at = window.rfind(" ")
    cut = at if at > 0 else limit
    return text[:cut], text[cut:].strip()


def relative_path(value: Any, cwd: Any) -> str:
    """A path as the user typed it from where the run started: relative to ``cwd`` when it lies
    under it, else as given (a built-in target's name, a path elsewhere, no ``cwd`` recorded)."""
    text = "" if value is None else str(value)
    if not isinstance(cwd, str) or not os.path.isabs(cwd) or not os.path.isabs(text):
        return text
    try:
        rel = os.path.relpath(text, cwd)
    except ValueError:
        return text
    return text if rel == os.pardir or rel.startswith(os.pardir + os.sep) else rel


def shorten_paths(text: str, cwd: Any) -> str:
    """``text`` with every absolute path under ``cwd`` written relative to it, so a message that
    names the target file does not repeat a long absolute prefix on every line of a report."""
    if not isinstance(cwd, str) or not os.path.isabs(cwd) or cwd.rstrip(os.sep) == "":
        return text
    return text.replace(cwd.rstrip(os.sep) + os.sep, "")


def one_line(text: Any, limit: int = 160) -> str:
    """First non-empty line, whitespace collapsed, at most ``limit`` characters."""
    text = "" if text is None else str(text)
    first = next((line for line in text.splitlines() if line.strip()), "")
    short, cut = truncate(" ".join(first.split()), limit)
    more = len([line for line in text.splitlines() if line.strip()]) > 1
    return short + (" …" if more and not cut else "")


def number(value: Any) -> float | None:
    """A finite float, or ``None`` for anything else (bools, strings, NaN written as text)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def seconds(value: Any) -> str:
    v = number(value)
    if v is None:
        return DASH
    if v < 1e-3:
        return f"{v * 1e6:.0f} µs"
    if v < 1:
        return f"{v * 1e3:.1f} ms"
    if v < 120:
        return f"{v:.1f} s"
    return f"{v / 60:.1f} min"


def mem(value: Any) -> str:
    """Bytes of memory, one decimal in the largest binary unit (``1.7 GiB``, ``412.0 MiB``)."""
    v = number(value)
    if v is None or v < 0:
        return DASH
    for size, unit in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if v >= size:
            return f"{v / size:.1f} {unit}"
    return f"{v:.0f} B"


def _metrics(record: Mapping[str, Any]) -> Mapping[str, Any]:
    metrics = record.get("metrics")
    return metrics if isinstance(metrics, Mapping) else {}


def peak_memory(record: Mapping[str, Any]) -> str:
    """The check's peak RSS as ``supervisor / process tree``, for the table's column."""
    m = _metrics(record)
    sup, tree = number(m.get(SUPERVISOR_PEAK_RSS)), number(m.get(TREE_PEAK_RSS))
    if sup is None and tree is None:
        return DASH
    return f"{mem(sup)} / {mem(tree)}"


def model_size(record: Mapping[str, Any]) -> str:
    """``2.10 M parameters (8.0 MiB)``, or a dash when the check ran on its own vehicle."""
    m = _metrics(record)
    params, nbytes = number(m.get(MODEL_PARAMETERS)), number(m.get(MODEL_BYTES))
    if params is None:
        return DASH
    count = f"{params / 1e9:.2f} B" if params >= 1e9 else f"{params / 1e6:.2f} M" if params >= 1e4 else f"{params:.0f}"
    return f"{count} parameters" + (f" ({mem(nbytes)})" if nbytes is not None else "")


def cost_line(record: Mapping[str, Any]) -> str:
    """What the check cost, in one line: time, peak memory of supervisor and tree, model size."""
    m = _metrics(record)
    parts = [f"took {seconds(record.get('duration_s'))}"]
    if number(m.get(SUPERVISOR_PEAK_RSS)) is not None or number(m.get(TREE_PEAK_RSS)) is not None:
        parts.append(f"peak RSS: supervisor {mem(m.get(SUPERVISOR_PEAK_RSS))}, "
                     f"process tree {mem(m.get(TREE_PEAK_RSS))}")
    if number(m.get(MODEL_PARAMETERS)) is not None:
        parts.append(f"model {model_size(record)}")
    return "; ".join(parts)


def timestamp(value: Any) -> str:
    v = number(value)
    if v is None:
        return DASH
    try:
        return datetime.fromtimestamp(v, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):
        return DASH


def key_figure(record: Mapping[str, Any]) -> str:
    """The one number a reader wants in the table: the check's own, else a derived one."""
    metrics = record.get("metrics")
    if not isinstance(metrics, Mapping):
        return DASH
    own = metrics.get("key_figure")
    if isinstance(own, (str, int, float)) and not isinstance(own, bool) and str(own).strip():
        return one_line(own, 80)
    best = number(metrics.get(BEST_BUCKET_CAP_MB))
    if best is not None:
        conf = number(metrics.get(CONFIGURED_BUCKET_CAP_MB))
        return f"best {best:g} MB" + (f" (configured {conf:g} MB)" if conf is not None else "")
    culprit = metrics.get(CULPRIT_RANK)
    if isinstance(culprit, int) and not isinstance(culprit, bool):
        return f"culprit rank {culprit}"
    sweep = metrics.get("sweep")
    if isinstance(sweep, list):
        measured = (number(p.get("busbw_gbps")) for p in sweep if isinstance(p, Mapping))
        peaks = [p for p in measured if p is not None]
        if peaks:
            return f"peak busbw {max(peaks):.1f} GB/s"
    latency = number(metrics.get("detection_latency_s"))
    if latency is not None:
        return f"detected in {seconds(latency)}"
    return DASH


def pretty_json(value: Any, limit: int) -> tuple[str, bool]:
    """Indented JSON of evidence, cut to ``limit`` characters for the page's sake."""
    try:
        text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return truncate(text, limit)
