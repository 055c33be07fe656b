"""Each example through the real command line on 2 gloo ranks: no false alarm. Every check
passed or was skipped with its reason, and the verdict is ready (exit 0).

The first two run the whole suite (~40-80 s each on a 2-core machine: the chaos checks start
their own worlds), hence slow; train_resnet.py ran it too until CI neared its 10 minutes. The
other examples run the CI subset (~10-20 s each): what
they add is in the conformance checks and hang-detection (Join, the mid-run look, remedies),
and their chaos and perf checks are the same code the first two run; their own failure modes
are tested in test_amp_join.py, test_example_bugs.py and tests/checks."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from ._variants import EXAMPLES

pytestmark = pytest.mark.slow

EXAMPLE_FILES = ("train_gpt.py", "train_split.py")
CI_SUBSET_FILES = ("train_resnet.py", "train_checkpointed.py", "train_amp_join.py", "train_fsdp2.py")
#: What each example must show besides passing: the checks with nothing to check skip with the
#: reason that is true of it, and the GPT's dropout is switched off for the comparison, said so.
SKIPS = {"train_gpt.py": {"sampler-coverage": "sampling with replacement"},
         "train_split.py": {"no-sync-equivalence": "train_step does no accumulation"},
         "train_resnet.py": {"no-sync-equivalence": "train_step does no accumulation"},
         "train_checkpointed.py": {"sampler-coverage": "defines no epoch_batches"},
         "train_amp_join.py": {"sampler-coverage": "defines no epoch_batches"},
         "train_fsdp2.py": {"sampler-coverage": "defines no epoch_batches"}}


#: The checks that time steps. On a loaded host (measured: pace above LOADED) one of them may
#: say it was too noisy to tell (the run is then inconclusive, issue 24) or find the load itself
#: (a straggler: the run is not ready). On a quiet host every check must pass or skip.
TIMING_CHECKS = {"straggler", "bucket-config", "allreduce-bandwidth"}
LOADED = 1.5


@pytest.mark.parametrize("example,suite", [*((e, "full") for e in EXAMPLE_FILES),
                                           *((e, "ci") for e in CI_SUBSET_FILES)])
def test_example_run_is_ready(tmp_path, example, suite, pace):
    report_dir = tmp_path / "report"
    proc = subprocess.run([sys.executable, "-m", "conformance", "run", "--target", str(EXAMPLES / example),
                           "--suite", suite, "--report-dir", str(report_dir)],
                          capture_output=True, text=True, timeout=600)
    report = json.loads((report_dir / "report.json").read_text())
    statuses = {c["id"]: (c["status"], c["message"]) for c in report["checks"]}
    alarms = {k: v for k, v in statuses.items() if v[0] not in ("passed", "skipped")}
    noisy = {k for k, (status, message) in alarms.items()
             if status == "inconclusive" and k in TIMING_CHECKS and re.search(r"nois", message)}
    # A gap whose side-by-side re-run did not reproduce is noise the check itself proved (seen:
    # bucket-config on train_resnet.py under three xdist workers): inconclusive, never failed.
    unreproduced = {k for k, (status, message) in alarms.items()
                    if status == "inconclusive" and k in TIMING_CHECKS
                    and re.search(r"did not reproduce|could not be told from this host's noise|once, then not again",
                                  message)}
    # Under measured load a timing check may also *find* what the load does: a rank slowed by
    # its neighbours (seen: straggler on train_split.py, "rank 1 ... in all 3 rounds", three
    # xdist workers on 2 cores), a layout that overlaps better on a shared core. That is the
    # host's finding, not the example's; on a quiet host it is an alarm.
    found = {k for k, (status, _) in alarms.items() if status == "failed" and k in TIMING_CHECKS}
    if (noisy or found) and pace.measure() <= LOADED:
        noisy, found = set(), set()  # on a quiet host: alarms
    noisy |= unreproduced
    alarms = {k: v for k, v in alarms.items() if k not in noisy | found}
    assert not alarms, "\n".join(f"{k}: {status}: {message}" for k, (status, message) in alarms.items())
    expected = (1, "not-ready") if found else (3, "inconclusive") if noisy else (0, "ready")
    assert proc.returncode == expected[0], (proc.stdout[-4000:], proc.stderr[-2000:])
    assert report["verdict"] == expected[1]
    assert all(message.strip() for _, message in statuses.values()), statuses  # a skip says why
    assert sum(status == "passed" for status, _ in statuses.values()) >= (5 if suite == "full" else 4), statuses
    for check_id, reason in SKIPS[example].items():
        assert statuses[check_id][0] == "skipped" and reason in statuses[check_id][1], statuses[check_id]
    if example == "train_gpt.py":
        gradient = next(c for c in report["checks"] if c["id"] == "gradient-equivalence")
        assert "dropout" in json.dumps(gradient["evidence"]) and "switched off" in json.dumps(gradient["evidence"])
