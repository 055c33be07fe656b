"""One pytest item per (check id, target) of the selection, and how one item runs: its check
through the session, its record and events attached to its test report (the controller writes
them), its status turned into pytest's."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ..harness.registry import BY_ID, select
from .keys import CASE_KEY, EVENTS_KEY, RECORD_KEY, TARGET_ERROR
from .terminal import printable


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "ddp_case" not in metafunc.fixturenames:
        return
    config = metafunc.config
    from ..harness.session import Settings

    settings = Settings(target=config.getoption("--ddp-target"),
                        compare_ddp=bool(config.getoption("--ddp-compare-ddp", False)))
    specs = select(config.getoption("--ddp-checks"), config.getoption("--ddp-suite"),
                   compare_ddp=bool(config.getoption("--ddp-compare-ddp", False)))
    params = []
    for spec in specs:
        marks = [getattr(pytest.mark, m) for m in spec.markers]
        if config.getoption("--ddp-backend") == "nccl":
            marks.append(pytest.mark.gpu)
        for target in settings.targets_for(spec):
            params.append(pytest.param((spec.id, target), id=f"{spec.id}:{target}", marks=marks))
    metafunc.parametrize("ddp_case", params)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "ddp_case" in callspec.params:
        check_id, target = callspec.params["ddp_case"]
        item.user_properties.append((CASE_KEY, json.dumps([check_id, target])))


def run_case(request: pytest.FixtureRequest, session: Any, check_id: str, target: str) -> None:
    """Run one check, attach its record to the test report, and turn its status into pytest's.

    Used by the suite's test function. ``inconclusive`` fails the pytest item (a CI gate must
    not go green on something it could not decide); the CLI's exit code keeps the nuance (3).
    """
    from ..harness.targets import TargetError
    from ..harness.world import LaunchedWorldUnreachable

    try:
        record, ctx = session.run_check(BY_ID[check_id], target)
    except TargetError as exc:
        request.config.stash[TARGET_ERROR] = str(exc)
        pytest.exit(f"target error: {exc}", returncode=pytest.ExitCode.USAGE_ERROR)
    except LaunchedWorldUnreachable as exc:  # under --attach: no check can run, stop at once
        pytest.exit(f"{exc}; nothing was verified, the run is inconclusive",
                    returncode=pytest.ExitCode.INTERRUPTED)
    events = [e.to_json() for e in (ctx.events if ctx else [])]
    request.node.user_properties.append((EVENTS_KEY, json.dumps(events)))
    request.node.user_properties.append((RECORD_KEY, json.dumps(record.to_json())))
    said = printable(f"{check_id} on {target}: {record.message}")
    if record.status == "failed":
        pytest.fail(said, pytrace=False)
    if record.status == "inconclusive":
        pytest.fail(f"INCONCLUSIVE {said}", pytrace=False)
    if record.status == "skipped":
        pytest.skip(said)
