"""write_reports end to end: a finished run, an empty one, a killed one, a torn line."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ddp_conformance.reports import CheckRecord, Event, ResultStore, write_reports
from ddp_conformance.reports.keys import VERIFIED
from tests.reports.sample import sample_run

CHECK_IDS = [
    "gradient-equivalence", "no-sync-equivalence", "rank-consistency", "sampler-coverage", "shared-weights",
    "unused-parameters", "straggler", "bucket-config", "hang-detection", "allreduce-bandwidth",
]


def test_sample_run_has_every_check_id() -> None:
    _, records, events = sample_run()
    assert [r.id for r in records] == CHECK_IDS
    assert {e.check for e in events} == {"straggler", "hang-detection"}


def test_sample_report(sample_dir: Path, sample_report: dict) -> None:
    assert sample_report["schema"] == 1
    assert sample_report["verdict"] == "not-ready"  # unused-parameters fails in the sample
    assert sample_report["complete"] is True
    assert sample_report["counts"] == {"passed": 9, "failed": 1, "inconclusive": 0, "skipped": 0}
    assert [c["id"] for c in sample_report["checks"]] == CHECK_IDS
    assert len(sample_report["events"]) == 2
    assert "harness_errors" not in sample_report
    for key in ("target", "environment", "started", "finished", "checks"):
        assert key in sample_report
    on_disk = json.loads((sample_dir / "report.json").read_text())
    assert on_disk["verdict"] == "not-ready" and on_disk["checks"][5]["id"] == "unused-parameters"
    assert (sample_dir / "report.md").read_text().startswith("# 🔴 DDP conformance: **NOT READY**")
    assert "NOT READY" in (sample_dir / "report.html").read_text()
    assert not list(sample_dir.glob(".*.tmp")), "atomic writes left a temporary file behind"


def test_failed_check_gets_a_rule_recommendation(sample_report: dict) -> None:
    unused = next(c for c in sample_report["checks"] if c["id"] == "unused-parameters")
    assert "find_unused_parameters=False" in unused["recommendation"]
    assert unused["recommendation_source"] == "rules"
    passed = next(c for c in sample_report["checks"] if c["id"] == "gradient-equivalence")
    assert passed["recommendation"] is None


def test_empty_run_is_inconclusive(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    store.start({"target": "mlp", "backend": "gloo", "world_size": 2, "suite": "ci", "environment": {}})
    store.finish()
    report = write_reports(tmp_path)
    assert report["verdict"] == "inconclusive"
    assert report["complete"] is True
    assert report["checks"] == []
    assert "nothing was actually verified" in " ".join(report["reasons"])
    assert "No check produced a result" in (tmp_path / "report.md").read_text()


def test_directory_without_anything_is_an_incomplete_inconclusive_report(tmp_path: Path) -> None:
    report = write_reports(tmp_path)
    assert (report["verdict"], report["complete"]) == ("inconclusive", False)


def test_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist; pass the --report-dir of a run"):
        write_reports(tmp_path / "nope")


def test_harness_error_in_run_meta_makes_it_inconclusive(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    store.start({"target": "mlp", "harness_error": "rank 1 failed to start: address in use"})
    store.append(CheckRecord("gradient-equivalence", "Gradient equivalence", "conformance", "passed", 1.0))
    store.finish()
    report = write_reports(tmp_path)
    assert report["verdict"] == "inconclusive"
    assert report["harness_errors"] == ["rank 1 failed to start: address in use"]
    assert "address in use" in (tmp_path / "report.html").read_text()


def test_selected_check_without_result_is_a_harness_error(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    store.start({"target": "mlp", "checks_selected": ["gradient-equivalence", "shared-weights"]})
    store.append(CheckRecord("gradient-equivalence", "Gradient equivalence", "conformance", "passed", 1.0))
    store.finish()
    report = write_reports(tmp_path)
    assert report["verdict"] == "inconclusive"
    assert report["missing_checks"] == ["shared-weights"]
    md = (tmp_path / "report.md").read_text()
    assert "## Checks that did not run (1)" in md and "- ⏹️ shared-weights" in md
    assert "produced no result (a harness error)" in md


def test_all_passed_finished_run_is_ready(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    store.start({"target": "mlp", "checks_selected": ["gradient-equivalence"]})
    store.append(CheckRecord("gradient-equivalence", "Gradient equivalence", "conformance", "passed", 1.0,
                             evidence={VERIFIED: {"ranks": 2, "optimizer_steps": 3, "nonzero_gradients": 4,
                                                  "allreduce_rounds": 3}}))
    store.append(Event("slow-rank", 1.0, 2.0, check="gradient-equivalence", rank=1))
    store.finish()
    report = write_reports(tmp_path)
    assert report["verdict"] == "ready"
    assert report["events"][0]["name"] == "slow-rank"
    assert "did not run" not in (tmp_path / "report.md").read_text()


KILLED_RUN = textwrap.dedent("""
    import os, signal, sys
    from ddp_conformance.reports import CheckRecord, Event, ResultStore
    store = ResultStore(sys.argv[1])
    store.start({"target": "mlp", "backend": "gloo", "world_size": 2, "suite": "ci",
                 "checks_selected": ["gradient-equivalence", "rank-consistency", "shared-weights"]})
    store.append(CheckRecord("gradient-equivalence", "Gradient equivalence", "conformance", "passed", 1.5, "ok"))
    store.append(Event("slow-rank", 10.0, 11.0, check="rank-consistency", rank=1))
    status = sys.argv[2]
    store.append(CheckRecord("rank-consistency", "Rank consistency", "conformance", status, 0.5, "params differ"))
    os.kill(os.getpid(), signal.SIGKILL)  # the supervisor dies mid-suite: no finish(), no report
""")


@pytest.mark.parametrize(("second", "verdict"), [("passed", "inconclusive"), ("failed", "not-ready")])
def test_run_killed_mid_suite_leaves_a_partial_report(tmp_path: Path, second: str, verdict: str) -> None:
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", KILLED_RUN, str(tmp_path), second], cwd=root,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert json.loads((tmp_path / "run.json").read_text())["finished"] is None
    # The kill may land mid-write in real life: simulate the torn tail a reader must skip.
    with open(tmp_path / "results.jsonl", "a") as f:
        f.write('{"id": "shared-weights", "title": "Shared wei')
    report = write_reports(tmp_path)
    assert report["complete"] is False
    assert report["verdict"] == verdict
    assert [c["id"] for c in report["checks"]] == ["gradient-equivalence", "rank-consistency"]
    assert report["missing_checks"] == ["shared-weights"]
    assert "harness_errors" not in report  # missing checks of a killed run are "not run", not a harness bug
    md = (tmp_path / "report.md").read_text()
    assert "Incomplete run" in md and "Not run: shared-weights." in md
    assert "## Checks that did not run (1)" in md and "- ⏹️ shared-weights" in md
    assert "the run stopped before them" in md
    html = (tmp_path / "report.html").read_text()
    assert 'id="incomplete"' in html and "not run: shared-weights" in html


def test_the_report_lists_checks_requested_run_and_missing_per_target(tmp_path: Path) -> None:
    """A (check, target) case without a record is missing even when the check ran on another
    target (a `-- -k mlp` deselection): the run cannot be ready."""
    store = ResultStore(tmp_path)
    store.start({"target": "built-in", "checks_selected": ["gradient-equivalence", "rank-consistency"],
                 "cases_selected": [["gradient-equivalence", "mlp"], ["gradient-equivalence", "tied-lm"],
                                    ["rank-consistency", "mlp"]]})
    verified = {VERIFIED: {"ranks": 2, "optimizer_steps": 3, "nonzero_gradients": 4, "allreduce_rounds": 3}}
    store.append(CheckRecord("gradient-equivalence", "Gradient equivalence", "conformance", "passed", 1.0,
                             target="mlp", evidence=verified))
    store.finish()
    report = write_reports(tmp_path)
    assert report["checks_requested"] == ["gradient-equivalence", "rank-consistency"]
    assert report["checks_run"] == ["gradient-equivalence"]
    assert report["missing_checks"] == ["rank-consistency", "gradient-equivalence on tied-lm"]
    assert report["verdict"] == "inconclusive"
    md = (tmp_path / "report.md").read_text()
    assert ("**Checks requested:** gradient-equivalence, rank-consistency · **run:** gradient-equivalence · "
            "**missing:** rank-consistency, gradient-equivalence on tied-lm") in md
    assert ("Checks requested: gradient-equivalence, rank-consistency · run: gradient-equivalence · "
            "missing: rank-consistency, gradient-equivalence on tied-lm") in (tmp_path / "report.html").read_text()


def test_a_lone_surrogate_in_a_name_or_message_renders_escaped(tmp_path: Path) -> None:
    store = ResultStore(tmp_path)
    store.start({"target": "t\udc80", "checks_selected": ["gradient-equivalence"]})
    store.append(CheckRecord("gradient-equivalence", "G", "conformance", "failed", 1.0,
                             "gradient of 'w\udc80' differs", metrics={"worst_grad_param": "w\ud800"},
                             evidence={"first_step_gradients": [{"name": "w\udc80"}]}))
    store.finish()
    report = write_reports(tmp_path)
    assert report["verdict"] == "not-ready"
    for name in ("report.md", "report.html", "report.json"):
        assert "udc80" in (tmp_path / name).read_text(encoding="utf-8")


def test_several_target_files_are_grouped_and_named_once_relative_to_where_the_run_started(tmp_path: Path) -> None:
    # Two target files of one project, the run started in the project folder: the CLI hands
    # the records absolute paths; the reports say each path once, as the user typed it.
    import re

    from tests.reports._runs import write_run

    project = tmp_path / "project"
    first, second = project / "targets" / "train_a.py", project / "targets" / "train_b.py"
    outside = "/opt/shared/train_c.py"
    records = [CheckRecord(cid, cid, "conformance", "passed", 1.0, f"{Path(target).stem}: fine", target=str(target))
               for cid in ("rank-consistency", "shared-weights") for target in (first, second, outside)]
    write_run(tmp_path / "out", records, target=f"{first},{second}", cwd=str(project))
    page = (tmp_path / "out" / "report.html").read_text()
    table = page[page.index('<table class="checks">'):]
    table = table[:table.index("</table>")]
    groups = re.findall(r'<tr class="group"><th colspan="6" scope="rowgroup">Target <span class="path">([^<]*)</span>',
                        table)
    assert groups == ["targets/train_a.py", "targets/train_b.py", outside]  # a path elsewhere: as given
    rows = re.findall(r"<tr class=\"st-passed\".*?</tr>", table, flags=re.S)
    assert len(rows) == 6 and not any(".py" in row for row in rows), rows
    assert str(project) + "/" not in re.sub(r"<details.*?</details>", "", page, flags=re.S).replace(
        f"relative to <span class=\"path\">{project}</span>", "")
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "| Target " in markdown and r"targets/train\_a.py" in markdown and str(project) not in markdown
