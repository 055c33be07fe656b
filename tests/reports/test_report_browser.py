"""report.html in a real headless Chromium: it renders, runs clean, and asks for nothing online;
and at 1,400 px a failed run's first screen says what failed, why and what to do.

Needs the Debian ``chromium`` package (``apt-get install -y chromium``; CI installs it);
skipped with a reason when it is absent. Two runs of the browser: ``--dump-dom`` with
console logging on stderr (the DOM after the page settled, and any console message), then
``--screenshot`` (the page actually paints). The layout test measures a copy of the page with a
probe script appended (the report itself runs no script): where the failure cards' cause and
fix lie, and whether anything reaches past the window's right edge.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import struct
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-default-apps", "--mute-audio"]
pytestmark = pytest.mark.skipif(not CHROMIUM.exists() and shutil.which("chromium") is None,
                                reason="headless browser test needs Chromium: apt-get install -y chromium")


def _chromium(profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    exe = str(CHROMIUM) if CHROMIUM.exists() else str(shutil.which("chromium"))
    # A private profile per run: no shared state between tests, nothing written to $HOME.
    return subprocess.run([exe, *FLAGS, f"--user-data-dir={profile}", *args],
                          capture_output=True, text=True, timeout=120)


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []
        self.rows: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        self.urls += [v for k, v in a.items() if k in ("src", "href", "action", "poster", "data") and v]
        if tag == "tr" and a.get("data-check"):
            self.rows.append(a["data-check"] or "")


def test_report_html_in_headless_chromium(sample_dir: Path, sample_report: dict, tmp_path: Path) -> None:
    page = sample_dir / "report.html"
    dom_run = _chromium(tmp_path / "p1", "--enable-logging=stderr", "--v=0", "--dump-dom", page.as_uri())
    assert dom_run.returncode == 0, dom_run.stderr[-2000:]
    dom = dom_run.stdout

    console = [line for line in dom_run.stderr.splitlines() if ":CONSOLE" in line or "Uncaught" in line]
    assert console == [], console
    assert not re.search(r"https?://", dom), "the page must not reference any URL"
    assert "url(" not in dom

    links = _Links()
    links.feed(dom)
    assert all(u.startswith("#") for u in links.urls), links.urls
    assert links.rows == [c["id"] for c in sample_report["checks"]]
    assert 'data-verdict="not-ready"' in dom and "NOT READY" in dom
    assert dom.count("<svg") >= 6  # bucket sweep, straggler bars, 2 timelines, bandwidth, projection
    assert 'class="fault"' in dom

    shot = tmp_path / "report.png"
    shot_run = _chromium(tmp_path / "p2", f"--screenshot={shot}", "--window-size=1280,2000", page.as_uri())
    assert shot_run.returncode == 0, shot_run.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert (width, height) == (1280, 2000)
    assert len(data) > 50_000, "a near-empty screenshot: the page did not paint"


def test_incomplete_banner_in_browser(tmp_path: Path) -> None:
    from ddp_conformance.reports.render import write_reports
    from tests.reports.sample import write_sample_run

    write_sample_run(tmp_path / "run", complete=False)
    write_reports(tmp_path / "run")
    result = _chromium(tmp_path / "p", "--dump-dom", (tmp_path / "run" / "report.html").as_uri())
    assert result.returncode == 0
    assert 'id="incomplete"' in result.stdout and "Incomplete run" in result.stdout
    assert 'data-verdict="not-ready"' in result.stdout  # a failed check outranks the incomplete run


#: Appended to a copy of report.html: measures the laid-out page and writes what it found into
#: the DOM, which --dump-dom prints. Every element whose box reaches past the window's right
#: edge is an overflow (a horizontal scrollbar at 1,400 px); elements inside a closed <details>
#: have no box and do not count.
LAYOUT_PROBE = """<script>
addEventListener("load", () => {
  const w = document.documentElement.clientWidth;
  const over = [...document.querySelectorAll("body *")]
    .filter(e => e.getBoundingClientRect().right > w + 0.5)
    .map(e => e.tagName.toLowerCase() + (e.className && typeof e.className === "string" ? "." + e.className : ""));
  const cards = [...document.querySelectorAll("#failures .failure")].map(card => ({
    check: card.dataset.check,
    cause_bottom: card.querySelector(".cause") && card.querySelector(".cause").getBoundingClientRect().bottom,
    fix_bottom: card.querySelector(".fix") && card.querySelector(".fix").getBoundingClientRect().bottom}));
  document.body.dataset.layout = JSON.stringify({width: w, height: innerHeight,
    scroll_width: document.documentElement.scrollWidth, overflowing: over.slice(0, 20), cards: cards});
});
</script>"""
SCREEN = (1400, 900)


@pytest.fixture(scope="module")
def failed_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What a CI job keeps of a not-ready run on the user's own target file: the run started in
    the project folder, the target given by its path there, the report dir an artifact folder."""
    project = tmp_path_factory.mktemp("ci") / "my-team" / "ddp-training-project"
    (project / "src" / "targets").mkdir(parents=True)
    target = project / "src" / "targets" / "branchy_unused.py"
    shutil.copy(Path(__file__).parents[1] / "faults" / "targets" / "branchy_unused.py", target)
    out = project / "ci-artifacts" / "report"
    proc = subprocess.run([sys.executable, "-m", "conformance", "run", "--target", "src/targets/branchy_unused.py",
                           "--checks", "unused-parameters,hang-detection,gradient-equivalence",
                           "--deadline", "60", "--report-dir", str(out)],
                          cwd=project, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    return {"dir": out, "project": project, "target": target,
            "report": json.loads((out / "report.json").read_text())}


def _layout(page: Path, profile: Path) -> tuple[dict[str, Any], str]:
    probe = page.with_name("layout-probe.html")
    probe.write_text(page.read_text().replace("</body>", LAYOUT_PROBE + "</body>"))
    run = _chromium(profile, f"--window-size={SCREEN[0]},{SCREEN[1]}", "--dump-dom", probe.as_uri())
    assert run.returncode == 0, run.stderr[-2000:]
    found = re.search(r'data-layout="([^"]*)"', run.stdout)
    assert found, "the probe did not run: " + run.stdout[-1000:]
    return json.loads(html.unescape(found.group(1))), run.stdout


def test_at_1400_px_the_failures_cause_and_fix_are_in_the_first_screen(failed_run: dict[str, Any],
                                                                       tmp_path: Path) -> None:
    layout, dom = _layout(failed_run["dir"] / "report.html", tmp_path / "p")
    # The window's own viewport (a 1,400 x 900 window shows about 1,385 x 757 of the page here):
    # the first screen is what it shows without scrolling.
    assert SCREEN[0] - 40 <= layout["width"] <= SCREEN[0] and 600 <= layout["height"] <= SCREEN[1], layout
    # Nothing overflows: no element past the right edge, no horizontal scrollbar.
    assert layout["overflowing"] == [] and layout["scroll_width"] <= layout["width"], layout
    failed = [c["id"] for c in failed_run["report"]["checks"] if c["status"] == "failed"]
    assert [card["check"] for card in layout["cards"]] == failed, layout["cards"]
    first = layout["cards"][0]
    assert first["check"] == "unused-parameters"
    assert 0 < first["cause_bottom"] <= layout["height"] and 0 < first["fix_bottom"] <= layout["height"], first


def test_the_verdict_links_each_failed_check_to_its_cause_and_fix(failed_run: dict[str, Any]) -> None:
    page = (failed_run["dir"] / "report.html").read_text()
    verdict = page[page.index('id="verdict"'):page.index('id="failures"')]
    cards = page[page.index('id="failures"'):page.index('id="checks"')]
    for check in (c for c in failed_run["report"]["checks"] if c["status"] == "failed"):
        anchor = re.search(rf'<a href="#([^"]+)">{re.escape(check["id"])}</a>', verdict)
        assert anchor, f"{check['id']} is not a link in the verdict card"
        card = cards[cards.index(f'id="{anchor.group(1)}"'):]
        card = card[:card.index("</article>")]
        # The cause (the record's message), whole behind its fold, and the one recommended fix:
        # the advice's first sentence leads, in bold, the rest after it.
        assert html.escape(check["message"].split(" -- ")[0], quote=False)[:120] in card
        fix = check["recommendation"]
        lead = re.split(r"(?<=[.!?])\s+(?=[A-Z])", fix, maxsplit=1)[0]
        assert f"<strong>{html.escape(lead, quote=False)}</strong>" in card, (lead, card)
    # gradient-equivalence hit DDP's own unused-parameter error: its fix is that cause's, not
    # the generic checklist for a gradient mismatch.
    step = next(c for c in failed_run["report"]["checks"] if c["id"] == "gradient-equivalence")
    assert "Expected to have finished reduction" in step["message"]
    assert step["recommendation"].startswith("Make every parameter receive a gradient at every step, or set "
                                             "find_unused_parameters=True in ddp_kwargs"), step["recommendation"]
    # hang-detection: the parameters DDP named as getting no gradient lead, not the checklist.
    hang = next(c for c in failed_run["report"]["checks"] if c["id"] == "hang-detection")
    assert re.match(r"Make aux_head\.bias, aux_head\.weight receive a gradient on every rank at every step "
                    r"\(ranks? [\d, ]+ produced none", hang["recommendation"]), hang["recommendation"]
    unused = next(c for c in failed_run["report"]["checks"] if c["id"] == "unused-parameters")
    assert unused["recommendation"].startswith("Set find_unused_parameters=True in ddp_kwargs: the failing "
                                               "steps re-ran to completion with it (verified fix)")


def test_evidence_is_never_cut_without_a_way_to_read_it_whole(failed_run: dict[str, Any], tmp_path: Path) -> None:
    page = (failed_run["dir"] / "report.html").read_text()
    cells = re.findall(r'<td class="ev">(.*?)</td>', page, flags=re.S)
    assert cells
    for text in cells:
        if "…" not in text:
            continue
        link = re.search(r'… <a class="more" href="#([^"]+)">whole text</a>$', text)
        assert link, f"a cut table cell without a link to its whole text: {text!r}"
        target = page[page.index(f'id="{link.group(1)}"'):]
        target = target[:target.index("</article>")]
        check = next(c for c in failed_run["report"]["checks"] if f'data-check="{c["id"]}"' in target)
        whole = check["message"].replace(str(failed_run["project"]) + "/", "")
        assert html.escape(whole, quote=False) in target, "the linked card does not hold the whole message"
        # The cut ends a thought: never mid-word.
        shown = html.unescape(text.split(" … ")[0])
        assert re.search(rf"{re.escape(shown)}(\s|[,;:]|$| --)", whole), shown


def test_the_target_path_is_relative_and_said_once(failed_run: dict[str, Any]) -> None:
    page = (failed_run["dir"] / "report.html").read_text()
    absolute = str(failed_run["target"])
    # Every record names the target by the absolute path the CLI resolved...
    assert all(c["target"] == absolute for c in failed_run["report"]["checks"])
    # ...the page says it as the user typed it, in the header, and not on every table row.
    header = page[:page.index('id="verdict"')]
    assert "src/targets/branchy_unused.py" in header
    table = page[page.index('<table class="checks">'):]
    table = table[:table.index("</table>")]
    assert "branchy_unused.py" not in table and absolute not in table
    visible = re.sub(r"<details.*?</details>", "", page, flags=re.S)
    assert absolute not in visible
