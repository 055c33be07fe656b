"""The report dir is not trusted (issue 34, docs/report-dir.md): the store never follows a link
planted in it, never truncates a file the run did not create, refuses a dir other users can
write, reads any bytes without crashing, and the run's report comes from what it wrote.

Each test acts as the other local user would: a symlink or hard link planted at a name the run
writes (or at its temporary name), a record rewritten on disk, a dir chowned or chmod'ed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ddp_conformance.reports import CheckRecord, ResultStore

#: What the victim file holds; every attack below must leave it byte for byte as it was.
PRECIOUS = "root:x:0:0:root:/root:/bin/bash\n"
OWN_NAMES = ["results.jsonl", "run.json", "report.json", "report.md", "report.html"]
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root (CI runs as root)")


@pytest.fixture
def victim(tmp_path: Path) -> Path:
    path = tmp_path / "victim"
    path.write_text(PRECIOUS)
    return path


@pytest.fixture
def out(tmp_path: Path) -> Path:
    directory = tmp_path / "out"
    directory.mkdir()
    directory.chmod(0o755)
    return directory


def _passed(check: str = "gradient-equivalence") -> CheckRecord:
    return CheckRecord(check, check, "conformance", "passed", 1.0)


def test_a_planted_lock_symlink_is_refused_and_its_victim_untouched(out: Path, victim: Path) -> None:
    (out / ".lock").symlink_to(victim)
    with pytest.raises(OSError, match=r"\.lock is a symbolic link \(to '.*victim'\); the run never "
                                      r"follows a link in its report dir.*remove it or pass another --report-dir"):
        ResultStore(out).lock()
    assert victim.read_text() == PRECIOUS


def test_a_planted_hard_link_lock_is_refused_and_its_victim_untouched(out: Path, victim: Path) -> None:
    os.link(victim, out / ".lock")
    with pytest.raises(OSError, match=r"\.lock has 2 links.*remove it or pass another --report-dir"):
        ResultStore(out).lock()
    assert victim.read_text() == PRECIOUS


@pytest.mark.parametrize("name", OWN_NAMES)
def test_a_symlink_planted_at_a_file_the_run_writes_is_refused_before_anything_is_written(
        out: Path, victim: Path, name: str) -> None:
    (out / name).symlink_to(victim)
    with pytest.raises(OSError, match=rf"{name} is a symbolic link"):
        ResultStore(out).lock()
    assert victim.read_text() == PRECIOUS
    assert not (out / ".lock").exists()


def test_start_replaces_a_planted_results_link_instead_of_truncating_its_victim(out: Path, victim: Path) -> None:
    """The pytest-plugin route, or a link planted between the lock and the start."""
    (out / "results.jsonl").symlink_to(victim)
    ResultStore(out).start({"target": "mlp"})
    assert victim.read_text() == PRECIOUS
    assert not (out / "results.jsonl").is_symlink() and (out / "results.jsonl").read_text() == ""


def test_a_results_link_planted_mid_run_never_receives_a_record(out: Path, victim: Path) -> None:
    store = ResultStore(out)
    store.start({"target": "mlp"})
    (out / "results.jsonl").unlink()
    (out / "results.jsonl").symlink_to(victim)
    with pytest.raises(OSError, match=r"results\.jsonl is a symbolic link"):
        store.append(_passed())
    assert victim.read_text() == PRECIOUS


def test_a_link_planted_at_the_temporary_name_of_run_json_never_reaches_its_victim(out: Path, victim: Path) -> None:
    (out / f".run.json.{os.getpid()}.tmp").symlink_to(victim)
    ResultStore(out).start({"target": "mlp"})
    assert victim.read_text() == PRECIOUS


@needs_root
def test_a_dir_owned_by_another_user_is_refused(out: Path) -> None:
    os.chown(out, 65534, 65534)
    with pytest.raises(OSError, match=rf"report dir '{out}' is owned by uid 65534, not by this user "
                                      rf"\(uid 0\).*pass a directory of your own"):
        ResultStore(out).lock()
    assert list(out.iterdir()) == []


def test_a_world_writable_dir_without_the_sticky_bit_is_refused(out: Path) -> None:
    out.chmod(0o777)
    with pytest.raises(OSError, match=rf"report dir '{out}' is writable by every user \(mode 0777, no "
                                      r"sticky bit\).*chmod o-w"):
        ResultStore(out).lock()
    assert list(out.iterdir()) == []


@pytest.mark.parametrize(("mode", "warning"), [
    (0o775, "is writable by its group (mode 0775)"),
    (0o1777, "is writable by every user (mode 1777, sticky bit)"),
])
def test_a_dir_others_can_add_files_to_gets_a_warning(out: Path, mode: int, warning: str) -> None:
    out.chmod(mode)
    said = ResultStore(out).lock()
    assert said is not None and warning in said and "nothing the run decides is read back" in said


def test_a_line_of_invalid_utf8_is_an_unreadable_line_not_a_crash(out: Path) -> None:
    store = ResultStore(out)
    store.start({"target": "mlp"})
    store.append(_passed())
    with open(store.results_path, "ab") as handle:
        handle.write(b'{"id": "rank-consistency", "status": "pa\xffssed"}\n')
    records, _ = store.read()
    assert [r.status for r in records] == ["passed", "inconclusive"]
    assert "results.jsonl line 2 is unreadable (not UTF-8: byte 0xff at column 41)" in records[1].message


def test_the_run_s_report_is_what_it_wrote_whatever_the_dir_says_by_then(out: Path) -> None:
    """Another user rewrites the failed record as passed mid-run: the run's own report (the
    one its exit code comes from) still says not ready."""
    from ddp_conformance.reports.render import write_run_reports

    store = ResultStore(out)
    store.start({"target": "mlp", "checks_selected": ["gradient-equivalence"]})
    store.append(CheckRecord("gradient-equivalence", "G", "conformance", "failed", 1.0, "gradients differ"))
    doctored = store.results_path.read_text().replace('"failed"', '"passed"')
    store.results_path.write_text(doctored)
    store.finish()
    assert write_run_reports(store)["verdict"] == "not-ready"
