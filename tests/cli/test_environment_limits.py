"""The environment is not the user's bug (conformance/harness/exhaustion.py): an error that
says the host ran out of disk, /dev/shm or file descriptors is recognised and named with its
fix; anything else is not; a soft open-file limit below the need is raised, a hard one is a
usage error (exit 2)."""

from __future__ import annotations

import errno
import resource

import pytest

from conformance.harness.exhaustion import exhausted, open_files, open_files_needed


@pytest.mark.parametrize(("error", "resource_named"), [
    (OSError(errno.ENOSPC, "No space left on device", "/tmp/x"), "disk space"),
    ("raised RuntimeError: writing the reference's snapshot to /tmp/full/ddp-session-1/ref failed: "
     "OSError(28, 'No space left on device'); the check's temp dir must be writable", "disk space"),
    ("unable to write to file </torch_1_2_0>: No space left on device (28)", "disk space"),
    ("raised OSError: [Errno 24] Too many open files", "open file descriptors (ulimit -n)"),
    (OSError(errno.EDQUOT, "Disk quota exceeded"), "disk quota"),
])
def test_running_out_is_named_with_its_fix(error: object, resource_named: str) -> None:
    line = exhausted(error)  # type: ignore[arg-type]
    assert line is not None and f"the host ran out of {resource_named}" in line
    assert "the environment, not the target" in line


def test_the_path_written_is_named_and_dev_shm_is_called_memory() -> None:
    line = exhausted("OSError(28, 'No space left on device') writing /dev/shm/ddp-session-x/ref")
    assert line is not None and "writing /dev/shm/ddp-session-x/ref (/dev/shm: memory)" in line


@pytest.mark.parametrize("error", ["shape (28) mismatch", "[Errno 2] No such file or directory",
                                   ValueError("loss is NaN"), OSError(errno.EACCES, "Permission denied")])
def test_other_errors_are_not_the_environment(error: object) -> None:
    assert exhausted(error) is None  # type: ignore[arg-type]


def test_a_low_soft_limit_is_raised() -> None:
    """(A hard limit too low: exit 2 with one line, tests/robustness/test_corpus.py.)"""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = open_files_needed(2)
    if hard != resource.RLIM_INFINITY and hard < need:
        pytest.skip(f"this host's hard open-file limit {hard} is below {need}")
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
        assert open_files(2) is None
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == need
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
