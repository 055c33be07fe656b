"""The renderers against seeded Faker data and adversarial strings.

HTML must stay escaped (no injected tag survives, parsed with html.parser), markdown must stay
under 1 MiB with exactly one cell per column on every table row. Faker is seeded at module
level so every pytest-xdist worker collects the same cases.
"""

from __future__ import annotations

import random
import re
from html.parser import HTMLParser
from typing import Any

import pytest
from faker import Faker

from ddp_conformance.reports import html, markdown
from ddp_conformance.reports.render import build_report
from ddp_conformance.reports.schema import STATUSES, CheckRecord, Event

ADVERSARIAL = [
    "<script>alert(1)</script>",
    '"><img src=x onerror=alert(1)>',
    "</td></tr></table><iframe src=https://evil.example/>",
    "a | b || c \\| d",
    "line one\nline two\r\nline | three",
    "```\nfenced\n```\n````",
    "`unbalanced backtick",
    "<details><summary>x",
    "مرحبا \u202eRTL override\u202c שלום",
    "emoji 🚀🔥 ✅ zero\u200bwidth",
    "{{ 7*7 }} {% raw %} ${jndi:ldap://x}",
    "&lt;already-escaped&gt; &amp; & <b>bold</b>",
    "*bold* _it_ [link](javascript:alert(1)) ![img](https://evil.example/x.png)",
    "",
]
CHECK_IDS = ["gradient-equivalence", "straggler", "bucket-config", "allreduce-bandwidth", "hang-detection"]
VOID = {"meta", "input", "br", "img", "hr", "link", "area", "base", "col", "embed", "source", "track", "wbr"}
# Every tag the template and the SVG charts write: anything else was injected.
TEMPLATE_TAGS = {
    "html", "head", "meta", "title", "style", "body", "main", "div", "span", "h1", "h2", "h3", "p", "strong",
    "section", "ul", "li", "dl", "dt", "dd", "details", "summary", "table", "thead", "tbody", "tr", "th", "td",
    "a", "input", "label", "article", "header", "pre", "figure", "figcaption", "footer",
    "svg", "g", "line", "text", "polyline", "circle", "rect",
}

Faker.seed(20240607)
_fake = Faker(["en_US", "ja_JP", "ar_AA", "he_IL"])
_rng = random.Random(20240607)


def _text() -> str:
    pick = _rng.random()
    if pick < 0.45:
        return _rng.choice(ADVERSARIAL)
    if pick < 0.7:
        return _fake.sentence()
    return _fake.text(max_nb_chars=300) + " " + _rng.choice(ADVERSARIAL)


def _metrics() -> dict[str, Any]:
    bad = _rng.choice([None, "NaN", -1, [], {}, [{"bucket_cap_mb": "x"}], [1, 2], _text()])
    metrics: dict[str, Any] = {"key_figure": _text() if _rng.random() < 0.5 else bad}
    if _rng.random() < 0.5:
        metrics["sweep"] = [{"bucket_cap_mb": _rng.choice([0.5, 1, 25, 50, bad]), "step_time_s": _rng.random(),
                             "bytes": _rng.choice([1024, 2**20, bad]), "busbw_gbps": _rng.random() * 100,
                             "algbw_gbps": _rng.random() * 50} for _ in range(_rng.randint(0, 6))]
    if _rng.random() < 0.5:
        metrics["per_rank"] = [{"rank": i, "compute_s": _rng.random(), "wait_s": _rng.choice([_rng.random(), bad])}
                               for i in range(_rng.randint(0, 5))]
        metrics["culprit_rank"] = _rng.choice([0, 1, None, "x", True])
    if _rng.random() < 0.5:
        metrics["timeline"] = [{"rank": r, "step": s, "t_start": s * 1.0, "t_end": _rng.choice([s + 0.5, s - 1.0, bad])}
                               for r in range(2) for s in range(3)]
    if _rng.random() < 0.3:
        metrics["projection"] = _rng.choice([bad, [{"world_size": 2**k, "efficiency": 1 - k / 12} for k in range(1, 8)]])
    return metrics


def _case(n: int) -> dict[str, Any]:
    records = [
        CheckRecord(
            id=_rng.choice(CHECK_IDS + [_text() or "x"]), title=_text(), kind="conformance",
            status=_rng.choice(STATUSES), duration_s=_rng.random() * 100, message=_text(),
            metrics=_metrics(), evidence={_text(): _text(), "names": [_text(), _fake.name()], "n": _rng.randint(0, 9)},
            recommendation=_rng.choice([None, _text()]), target=_rng.choice([None, _text()]),
        )
        for _ in range(_rng.randint(0, 7))
    ]
    events = [Event(_text() or "e", float(_rng.randint(0, 3)), _rng.choice([None, 2.5]), check=_rng.choice([r.id for r in records] or [None]),
                    rank=_rng.randint(0, 3), phase=_text()) for _ in range(_rng.randint(0, 3))]
    meta = {"target": _text(), "backend": _text(), "world_size": _rng.choice([2, "8", None]), "suite": _text(),
            "started": 1.7e9, "finished": _rng.choice([None, 1.7e9 + 60]), "harness_error": _rng.choice([None, _text()]),
            "environment": {"torch": _text(), "hostnames": [_text(), _fake.hostname()],
                            "settings": [{"name": "NCCL_DEBUG", "value": _text(), "default": False, "why": _text()}]}}
    return build_report(meta, records, events)


CASES = [_case(n) for n in range(40)]


class _Structure(HTMLParser):
    """Records every tag, checks nesting, and the rows of the checks table."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.check_rows = 0
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        self.tags.append((tag, attributes))
        if tag == "tr" and "data-check" in attributes:
            self.check_rows += 1
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else None}>")
        else:
            self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.text.append(data)


def _parse(page: str) -> _Structure:
    parser = _Structure()
    parser.feed(page)
    parser.close()
    return parser


def assert_html_is_safe(page: str, report: dict[str, Any]) -> _Structure:
    parsed = _parse(page)
    assert parsed.errors == [], parsed.errors[:5]
    assert parsed.stack == [], f"unclosed tags: {parsed.stack}"
    names = {tag for tag, _ in parsed.tags}
    assert names <= TEMPLATE_TAGS, f"tags the template never writes: {names - TEMPLATE_TAGS}"
    for tag, attrs in parsed.tags:
        assert not any(k.startswith("on") for k in attrs), (tag, attrs)
        for key in ("src", "href"):
            value = attrs.get(key) or ""
            assert not value.startswith(("http:", "https:", "//", "javascript:")), (tag, attrs)
    assert parsed.check_rows == len(report["checks"])
    return parsed


def _split_row(line: str) -> list[str]:
    """Cells of a GFM table row: a backslash escapes the next character, other pipes split."""
    cells, cur, i = [], "", 0
    while i < len(line):
        ch = line[i]
        if ch == "\\" and i + 1 < len(line):
            cur += line[i : i + 2]
            i += 2
            continue
        if ch == "|":
            cells.append(cur)
            cur = ""
        else:
            cur += ch
        i += 1
    cells.append(cur)
    return cells[1:-1]  # leading and trailing pipes


def _outside_fences(doc: str) -> str:
    out, fence = [], None
    for line in doc.splitlines():
        run = len(line) - len(line.lstrip("`"))
        if fence is None and run >= 3:
            fence = run
        elif fence is not None and run >= fence and not line.strip("`").strip():
            fence = None
        elif fence is None:
            out.append(line)
    assert fence is None, "a fenced block is left open"
    return "\n".join(out)


def assert_markdown_tables(doc: str) -> int:
    """Every table row has as many cells as its header; returns the number of check rows."""
    assert len(doc.encode("utf-8")) < 1024 * 1024
    rows = 0
    width = None
    for line in doc.splitlines():
        if line.startswith("|"):
            cells = _split_row(line)
            if width is None:
                width = len(cells)
            assert len(cells) == width, line[:200]
            rows += 1
        else:
            width = None
    return rows


@pytest.mark.parametrize("index", range(len(CASES)))
def test_html_stays_escaped(index: int) -> None:
    report = CASES[index]
    page = html.render(report)
    parsed = assert_html_is_safe(page, report)
    text = "".join(parsed.text)
    for check in report["checks"]:
        if check["message"].strip() and len(check["message"]) < 1000:
            assert check["message"].strip().splitlines()[0][:50] in text


@pytest.mark.parametrize("index", range(len(CASES)))
def test_markdown_table_shape(index: int) -> None:
    report = CASES[index]
    doc = markdown.render(report)
    if report["checks"]:
        assert "## Checks" in doc
    assert doc.splitlines()[0].startswith("# ")
    assert_markdown_tables(doc)
    prose = _outside_fences(doc)  # inside a fenced block raw text is shown verbatim, never rendered
    assert not re.search(r"(?<!\\)<(script|img|iframe)", prose), "an unescaped tag outside code blocks"


def test_markdown_column_count_with_pipes() -> None:
    records = [CheckRecord(f"c{i}", "t", "conformance", "failed", 1.0, text, metrics={"key_figure": text}, target=text)
               for i, text in enumerate(ADVERSARIAL)]
    report = build_report({"finished": 1.0}, records, [])
    doc = markdown.render(report)
    table = doc.split("## Checks", 1)[1].split("##", 1)[0]
    # header + separator + one row per check
    assert assert_markdown_tables(table) == 2 + len(records)
    assert "\\|" in table


def test_one_megabyte_message() -> None:
    huge = ("x | y\n<script>alert(1)</script> " * 40_000)[: 1024 * 1024]
    record = CheckRecord("gradient-equivalence", "Gradient", "conformance", "failed", 1.0, huge,
                         evidence={"trace": huge})
    report = build_report({"finished": 1.0}, [record], [])
    doc = markdown.render(report)
    assert len(doc.encode()) < 64 * 1024
    assert "Message truncated" in doc
    assert_markdown_tables(doc)
    page = html.render(report)
    assert len(page.encode()) < 300 * 1024
    assert_html_is_safe(page, report)
    assert "truncated" in page


def test_many_checks_are_cut_to_fit_a_job_summary() -> None:
    records = [CheckRecord(f"check-{i}", "t", "conformance", "failed", 1.0, "| " * 2000, evidence={"k": "v" * 2000})
               for i in range(600)]
    doc = markdown.render(build_report({"finished": 1.0}, records, []))
    assert len(doc.encode()) < 1024 * 1024
    assert "Report truncated" in doc
    assert doc.count("<details>") == doc.count("</details>")
    assert doc.count("\n```") % 2 == 0 or doc.count("````") > 0
    assert_markdown_tables(doc)
