"""The pytest-plugin route writes its reports through the same untrusting store as the CLI
(issue 34, docs/report-dir.md): a planted link is a usage error and its victim is untouched."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

PRECIOUS = "root:x:0:0:root:/root:/bin/bash\n"


@pytest.mark.parametrize("name", [".lock", "results.jsonl"])
def test_a_planted_symlink_is_a_usage_error_and_its_victim_untouched(pytester: pytest.Pytester,
                                                                   tmp_path: Path, name: str) -> None:
    victim = tmp_path / "victim"
    victim.write_text(PRECIOUS)
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o755)
    (out / name).symlink_to(victim)
    result = pytester.runpytest_subprocess("--pyargs", "conformance.suite", "--ddp-report-dir", str(out),
                                           "--ddp-target", "mlp", "--ddp-checks", "sampler-coverage",
                                           "-p", "no:cacheprovider", timeout=120)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*{out}/{name} is a symbolic link*never follows a link in its report dir*"])
    assert victim.read_text() == PRECIOUS


def test_a_group_writable_report_dir_is_said_and_the_run_goes_on(pytester: pytest.Pytester, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    out.chmod(0o775)
    # gradient-equivalence: ready needs the training step verified (docs/architecture.md, "Results").
    result = pytester.runpytest_subprocess("--pyargs", "conformance.suite", "--ddp-report-dir", str(out),
                                           "--ddp-target", "mlp", "--ddp-checks", "gradient-equivalence",
                                           "-p", "no:cacheprovider", timeout=180)
    assert result.ret == pytest.ExitCode.OK
    result.stdout.fnmatch_lines([f"*[[]ddp[]] warning: report dir '{out}' is writable by its group (mode 0775)*",
                                 "*[[]ddp[]] verdict: ready*"])
