"""A run leaves no ``torchinductor_<user>`` folder in the ``TMPDIR`` it was given (issue 34 §5).

Importing ``torch._dynamo`` creates inductor's cache folder, ``$TMPDIR/torchinductor_<user>``
unless ``TORCHINDUCTOR_CACHE_DIR`` names another; every zygote, rank and compiled target's
loader imports it. The run points each of its processes into one of its own temp dirs
(``conformance/harness/world/_caches.py``), removed at exit; a cache folder the user names is
left to the user."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ._run import TARGETS, Run

VAR = "TORCHINDUCTOR_CACHE_DIR"


@pytest.mark.parametrize("start", ["zygote", "spawn"])
def test_a_run_leaves_no_torchinductor_folder_in_its_tmpdir(start: str, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # This test process may have imported torch._dynamo, which writes torch's default folder
    # (under the outer TMPDIR) into os.environ: the run must see what a user's shell has.
    monkeypatch.delenv(VAR, raising=False)
    env = {"DDP_CONFORMANCE_START": "spawn"} if start == "spawn" else {}
    run = Run(["run", "--target", str(TARGETS / "imports_dynamo.py"), "--checks", "gradient-equivalence",
               "--report-dir", str(tmp_path / "out")], tmp_path, env=env)
    done = run.wait()
    assert done.code == 0, done.stderr[-3000:]
    procs, dirs = run.leftovers(within_s=5.0)
    assert not procs, f"processes outlived the run: {procs}"
    assert not dirs, f"temp dirs left behind: {dirs}"
    assert not list(run.tmp.glob("torchinductor_*")), sorted(p.name for p in run.tmp.iterdir())


def test_the_cache_goes_below_the_runs_folder_unless_the_user_named_one(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from conformance.harness.world import compile_cache_env

    monkeypatch.delenv(VAR, raising=False)
    assert compile_cache_env(tmp_path) == {VAR: os.path.join(tmp_path, "torchinductor")}
    # torch's own default, written back by its first import of torch._dynamo: not a choice.
    monkeypatch.setenv(VAR, default_cache_dir())
    assert compile_cache_env(tmp_path) == {VAR: os.path.join(tmp_path, "torchinductor")}
    monkeypatch.setenv(VAR, str(tmp_path / "warm-cache"))
    assert compile_cache_env(tmp_path) == {}
