"""Bad usage exits 2 with one line saying what is wrong and how to fix it."""

from __future__ import annotations

import pytest

from conformance.cli import main


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, f"expected one line, got {err}"
    assert err[0].startswith("ddp-conformance: error: ")
    return err[0]


@pytest.mark.parametrize(("argv", "message"), [
    (["--world-size", "0"], "--world-size 0 must be at least 1"),
    (["--backend", "nccl"], "--backend nccl needs GPUs but none are visible here; use --backend gloo"),
    (["--backend", "mpi"], "--backend 'mpi' is not one of auto, gloo, nccl"),
    (["--checks", "gradient-equivalence,nope"], "unknown check id 'nope'; known ids: gradient-equivalence"),
    (["--suite", "nightly"], "--suite 'nightly' is not one of ci, full"),
    (["--deadline", "0"], "--deadline 0 must be a positive number of seconds"),
    (["--attach"], "--attach needs a launcher: run it under torchrun or srun"),
])
def test_bad_run_options_exit_2(argv: list[str], message: str, tmp_path, capsys, monkeypatch) -> None:
    for var in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(var, raising=False)
    assert main(["run", "--report-dir", str(tmp_path / "out"), *argv]) == 2
    assert message in _error_line(capsys)
    assert not (tmp_path / "out" / "report.json").exists()


def test_unwritable_report_dir_exits_2(tmp_path, capsys) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(["run", "--report-dir", str(blocker / "out")]) == 2
    assert "is not writable" in _error_line(capsys)


def test_report_of_a_missing_run_exits_2(tmp_path, capsys) -> None:
    assert main(["report", str(tmp_path)]) == 2
    assert "results.jsonl does not exist" in _error_line(capsys)


def test_list_names_every_check_and_builtin_target(capsys) -> None:
    from conformance.harness.registry import CHECKS

    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for spec in CHECKS:
        assert spec.id in out
    assert "built-in targets: mlp, tied-lm, branchy, convbn" in out
