"""`ddp-conformance report DIR` over a dir it cannot trust (issue 34, docs/report-dir.md): it
re-renders, it is not a verdict. It refuses a dir other users can write, never follows a link
there, never crashes on bytes (a garbled line is named and the re-render is inconclusive), and
says that the re-rendered verdict is only as trustworthy as the dir."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conformance.cli import main
from ddp_conformance.reports import CheckRecord, ResultStore

PRECIOUS = "root:x:0:0:root:/root:/bin/bash\n"


def _finished_run(directory: Path, status: str = "passed") -> ResultStore:
    store = ResultStore(directory)
    store.start({"target": "mlp", "checks_selected": ["gradient-equivalence"]})
    store.append(CheckRecord("gradient-equivalence", "Gradient equivalence", "conformance", status, 1.0))
    store.finish()
    directory.chmod(0o755)
    return store


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, f"expected one line, got {err}"
    assert err[0].startswith("ddp-conformance: error: ")
    return err[0]


@pytest.mark.parametrize(("garbage", "said"), [
    (b'{"id": "rank-consistency", "status": "pa\xffssed"}\n', "not UTF-8: byte 0xff at column 41"),
    (b"}{ not json\n", "Expecting value"),
])
def test_a_garbled_line_is_named_and_the_re_render_is_inconclusive(tmp_path: Path, garbage: bytes, said: str,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    store = _finished_run(tmp_path / "out")
    with open(store.results_path, "ab") as handle:
        handle.write(garbage)
    assert main(["report", str(store.dir)]) == 3
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "results.jsonl line 2 is unreadable" in lines[0] and said in lines[0], lines
    assert "Traceback" not in err
    assert "verdict: inconclusive" in out


def test_report_says_a_re_rendered_verdict_is_only_as_trustworthy_as_the_dir(tmp_path: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A failed record rewritten as passed cannot be told from an honest one: say so."""
    store = _finished_run(tmp_path / "out", status="failed")
    store.results_path.write_text(store.results_path.read_text().replace('"failed"', '"passed"'))
    main(["report", str(store.dir)])
    out = capsys.readouterr().out
    assert (f"a re-rendered verdict is only as trustworthy as {store.dir}: anyone who can write there "
            f"can change its records; the verdict of record is the run's own exit code") in out


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root (CI runs as root)")
def test_report_refuses_a_dir_owned_by_another_user(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = _finished_run(tmp_path / "out")
    os.chown(store.dir, 65534, 65534)
    assert main(["report", str(store.dir)]) == 2
    assert f"report dir '{store.dir}' is owned by uid 65534, not by this user (uid 0)" in _error_line(capsys)
    assert not (store.dir / "report.json").exists()


def test_report_refuses_a_world_writable_dir_without_the_sticky_bit(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    store = _finished_run(tmp_path / "out")
    store.dir.chmod(0o777)
    assert main(["report", str(store.dir)]) == 2
    assert "is writable by every user (mode 0777, no sticky bit)" in _error_line(capsys)


def test_report_never_reads_records_through_a_planted_link(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    elsewhere = _finished_run(tmp_path / "elsewhere")  # records of another run, somewhere else
    out = tmp_path / "out"
    out.mkdir()
    (out / "results.jsonl").symlink_to(elsewhere.results_path)
    assert main(["report", str(out)]) == 2
    assert f"{out}/results.jsonl is a symbolic link" in _error_line(capsys)
    assert not (out / "report.json").exists()


def test_report_never_writes_through_a_link_planted_at_its_temporary_names(tmp_path: Path) -> None:
    store = _finished_run(tmp_path / "out")
    victims = []
    for name in ("report.json", "report.md", "report.html"):
        victim = tmp_path / f"victim-{name}"
        victim.write_text(PRECIOUS)
        (store.dir / f".{name}.{os.getpid()}.tmp").symlink_to(victim)
        victims.append(victim)
    assert main(["report", str(store.dir)]) == 3  # one check passed, unverified: inconclusive
    assert [v.read_text() for v in victims] == [PRECIOUS] * 3
