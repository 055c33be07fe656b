"""Shared fixtures of the project's own tests. Where a new test goes: tests/README.md."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

TESTS = Path(__file__).resolve().parent
BROKEN_TARGETS = TESTS / "targets"


#: The modules with the longest tests (measured with --durations on a 2-core host), run first.
#: Under ``-n 3`` with ``--dist loadgroup`` (pyproject.toml) a free worker takes the next test in
#: this order, so the long ones spread over the workers early instead of one worker finishing
#: the run alone on a 60 s test while the others idle.
LONGEST_FIRST = (
    "tests/examples/test_examples_run.py",
    "tests/targets_loader/test_target_errors_cli.py",
    "tests/robustness/test_corpus.py",
    "tests/checks/test_compiled.py",
    "tests/plugin/test_plugin.py",
    "tests/robustness/test_gate_isolation.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))  # stable


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "timing: the test bounds a wall-clock time (a detection latency, an exit "
                                       "budget); its bound scales with the host's measured contention (pace)")


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


class Pace:
    """How many times slower than an idle core this machine runs, measured now and again when
    a bound is taken (``conformance.harness.load.contention``: wall over CPU time of a short
    spin; 1.0 on a quiet host). A test's wall-clock bound is ``pace.bound(seconds)``: the
    seconds it needs on a quiet machine times the worst contention measured during the test, so
    the same test holds on a loaded CI runner (issue 24) and stays as strict on a quiet one."""

    SAMPLE_S = 0.05

    def __init__(self) -> None:
        from conformance.harness.load import contention

        self._measure = contention
        self.factor = contention(self.SAMPLE_S)

    def measure(self) -> float:
        self.factor = max(self.factor, self._measure(self.SAMPLE_S))
        return self.factor

    def bound(self, seconds: float) -> float:
        return seconds * self.measure()


@pytest.fixture
def pace() -> Pace:
    """This machine's measured contention, for wall-clock bounds (see :class:`Pace`)."""
    return Pace()


def target_path(name: str) -> str:
    """Absolute path of a deliberately broken (or correct) target under tests/targets/."""
    return str(BROKEN_TARGETS / f"{name}.py")
