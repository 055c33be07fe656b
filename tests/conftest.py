"""Shared fixtures of the project's own tests. Where a new test goes: tests/README.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

TESTS = Path(__file__).resolve().parent
BROKEN_TARGETS = TESTS / "targets"


@pytest.fixture(scope="session")
def suite_session() -> Iterator[Any]:
    """A gloo, 2-rank Session shared by every test of this pytest worker.

    ``suite_session.run_check(BY_ID[id], "builtin")`` runs a chaos check in injected mode
    (faults into built-in vehicles); ``run_check(spec, target_path("x"))`` runs any check on
    a target file as configured.

    Its persistent worlds are started on first use and reused (a failed call replaces
    them), so tests pay the ~5 s world start-up once per worker, not once per test.
    """
    from conformance.harness.session import Session, Settings

    session = Session(Settings(backend="gloo", world_size=2, deadline=60.0))
    yield session
    session.close()


def target_path(name: str) -> str:
    """Absolute path of a deliberately broken (or correct) target under tests/targets/."""
    return str(BROKEN_TARGETS / f"{name}.py")
