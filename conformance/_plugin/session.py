"""The suite's session fixtures: one Session per process (settings plus persistent worlds,
closed at the end), the persistent world, and SIGTERM handled like Ctrl-C while they live."""

from __future__ import annotations

import signal
import threading
from typing import Any, Iterator

import pytest

from .keys import HOSTNAMES, INTERRUPTED, KEPT_TMP, STARTUP
from .options import on, selected, settings_from
from .terminal import progress


def terminate_as_interrupt(config: pytest.Config) -> Any:
    """SIGTERM is handled like Ctrl-C: KeyboardInterrupt in the main thread, so the same path
    kills the ranks, writes an incomplete report and exits. Both are remembered: a run that
    was interrupted is never marked complete, even if pytest's own status says otherwise."""
    def handler(signum: int, frame: Any) -> None:
        config.stash[INTERRUPTED] = True
        raise KeyboardInterrupt(f"{signal.Signals(signum).name} received")

    if threading.current_thread() is not threading.main_thread():
        return None
    return {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}


@pytest.fixture(scope="session")
def ddp_session(pytestconfig: pytest.Config) -> Iterator[Any]:
    """The process's suite session: settings plus persistent worlds, closed at the end."""
    from ..harness.root_cause import RootCauses
    from ..harness.session import Session

    previous = terminate_as_interrupt(pytestconfig)
    session = Session(settings_from(pytestconfig), progress=lambda line: progress(pytestconfig, line),
                      label=lambda check_id, target: f"[ddp] {check_id}{on(pytestconfig, target)}",
                      root_causes=RootCauses())
    try:
        session.prewarm(reference=any(spec.reference for spec in selected(pytestconfig)))
        # The run's start-up, waited for before the first check so that check's time is its own.
        pytestconfig.stash[STARTUP] = round(session.ready(), 3)
        yield session
    finally:
        pytestconfig.stash[HOSTNAMES] = session.hostnames  # for the report, written after teardown
        try:
            session.close()
        finally:
            if session.settings.keep_tmp:  # said in the terminal summary (teardown output is captured)
                pytestconfig.stash[KEPT_TMP] = str(session.tmpdir)
            for sig, old in (previous or {}).items():
                signal.signal(sig, old)


@pytest.fixture(scope="session")
def ddp_world(ddp_session: Any) -> Any:
    """The persistent world for the configured backend and world size."""
    from ..harness.world import WorldUnavailable

    try:
        return ddp_session.world()
    except WorldUnavailable as exc:
        pytest.skip(str(exc))
