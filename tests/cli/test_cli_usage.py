"""Bad usage exits 2 with one line saying what is wrong and how to fix it."""

from __future__ import annotations

from importlib import metadata
from pathlib import Path

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
    (["--deadline", "nan"], "--deadline nan must be a positive number of seconds, finite and at most 3600"),
    (["--deadline", "inf"], "--deadline inf must be a positive number of seconds, finite and at most 3600"),
    (["--deadline", "1e9"], "--deadline 1e+09 must be a positive number of seconds, finite and at most 3600"),
    (["--checks", ","], "--checks ',' names no check; pass check ids separated by commas"),
    (["--checks", ""], "--checks '' names no check; pass check ids separated by commas"),
    (["--report-dir", ""], "--report-dir '' is empty; pass a directory"),
    (["--world-size", "4096"], "world_size=4096 gloo ranks cannot start on"),
    (["--", "--ddp-report-dir", "elsewhere"], "--ddp-report-dir after -- would override ddp-conformance's own option"),
    (["--attach"], "--attach needs a launcher: run it under torchrun or srun"),
    (["--compare-ddp"], "--compare-ddp needs --target: it runs that target through its parallelize and through DDP"),
    (["--link-gbps", "0"], "--link-gbps 0 must be a positive number of Gbit/s, at most 10000 (e.g. 100 for 100 GbE"),
    (["--link-gbps", "nan"], "--link-gbps nan must be a positive number of Gbit/s"),
    (["--junit-xml", "/nonexistent-dir/ddp.xml"], "--junit-xml '/nonexistent-dir/ddp.xml': its folder "
                                                  "'/nonexistent-dir' does not exist or is not writable"),
    (["--junit-xml", "/tmp"], "--junit-xml '/tmp' must name a file (e.g. ddp-junit.xml), not a directory"),
])
def test_bad_run_options_exit_2(argv: list[str], message: str, tmp_path, capsys, monkeypatch) -> None:
    for var in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS"):
        monkeypatch.delenv(var, raising=False)
    if "--report-dir" in argv:
        argv = ["run", *argv]
    else:
        argv = ["run", "--report-dir", str(tmp_path / "out"), *argv]
    assert main(argv) == 2
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
    assert "built-in targets: mlp, tied-lm, branchy, convbn, trainer" in out


def test_version_names_the_package_and_its_torch_without_importing_torch(capsys) -> None:
    import subprocess
    import sys

    from conformance import __version__

    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"ddp-conformance {__version__} (torch {metadata.version('torch')})"
    # A fresh interpreter: --version must answer without loading torch (seconds for one line).
    probe = ("import sys; from conformance.cli import main\ntry: main(['--version'])\n"
             "except SystemExit: pass\nprint('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.splitlines()[-1] == "False"


#: The pages whose 'Command line' block shows `ddp-conformance run`'s synopsis.
SYNOPSES = (Path("docs", "running.md"), Path("README.md"))


@pytest.mark.parametrize("page", SYNOPSES, ids=str)
def test_every_run_option_is_in_the_documented_synopsis(page: Path, capsys) -> None:
    import re

    with pytest.raises(SystemExit):
        main(["run", "--help"])
    offered = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*[a-z]", capsys.readouterr().out)) - {"--help"}
    assert {"--target", "--junit-xml", "--compare-ddp"} <= offered, sorted(offered)
    text = (Path(__file__).resolve().parents[2] / page).read_text()
    block = text[text.index("\n## Command line"):]
    block = block[block.index("```"):]
    synopsis = block[:block.index("```", 3)]
    missing = sorted(o for o in offered if f"[{o}" not in synopsis)
    assert not missing, f"{page}'s synopsis of `ddp-conformance run` lacks {missing}"


def test_a_report_dir_with_a_directory_for_results_exits_2(tmp_path, capsys) -> None:
    (tmp_path / "out" / "results.jsonl").mkdir(parents=True)
    assert main(["run", "--report-dir", str(tmp_path / "out")]) == 2
    assert "results.jsonl is not a regular file; remove it or pass another --report-dir" in _error_line(capsys)


def test_report_of_a_nan_line_is_inconclusive_with_one_line(tmp_path, capsys) -> None:
    from ddp_conformance.reports import CheckRecord, ResultStore

    store = ResultStore(tmp_path)
    store.start({"target": "mlp", "checks_selected": ["gradient-equivalence"]})
    store.append(CheckRecord("gradient-equivalence", "Gradient equivalence", "conformance", "passed", 1.0))
    with open(store.results_path, "a") as f:
        f.write('{"id": "rank-consistency", "status": "passed", "duration_s": NaN}\n')
    store.finish()
    assert main(["report", str(tmp_path)]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "results.jsonl line 2 is unreadable (NaN is not JSON)" in err[0], err


def test_report_into_a_read_only_dir_exits_2_with_one_line(tmp_path, capsys) -> None:
    import os

    from ddp_conformance.reports import CheckRecord, ResultStore

    if os.geteuid() == 0:
        pytest.skip("root writes into read-only directories; run as a normal user to see this")
    store = ResultStore(tmp_path / "ro")
    store.start({"target": "mlp"})
    store.append(CheckRecord("gradient-equivalence", "Gradient equivalence", "conformance", "passed", 1.0))
    store.finish()
    os.chmod(store.dir, 0o555)
    try:
        assert main(["report", str(store.dir)]) == 2
        assert "cannot write the report into" in _error_line(capsys)
    finally:
        os.chmod(store.dir, 0o755)


def _probe_repeatedly(directory: str, times: int) -> None:
    from pathlib import Path

    from conformance.cli import _check_writable

    for _ in range(times):
        _check_writable(Path(directory))


def test_ranks_probing_one_report_dir_at_once_do_not_trip_each_other(tmp_path) -> None:
    """Under torchrun every rank checks the shared --report-dir: seen in CI as a two-node run
    whose rank 1 exited 2, 'not writable (No such file or directory)', when rank 0 unlinked
    the probe file both had written under one name."""
    from tests._processes import run_forked

    assert run_forked(_probe_repeatedly, [(str(tmp_path), 400)] * 4) == [0, 0, 0, 0]
    assert list(tmp_path.iterdir()) == []  # no probe left behind
