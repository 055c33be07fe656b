"""report.html in a real headless Chromium: it renders, runs clean, and asks for nothing online.

Needs the Debian ``chromium`` package (``apt-get install -y chromium``; CI installs it);
skipped with a reason when it is absent. Two runs of the browser: ``--dump-dom`` with
console logging on stderr (the DOM after the page settled, and any console message), then
``--screenshot`` (the page actually paints).
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
from html.parser import HTMLParser
from pathlib import Path

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
