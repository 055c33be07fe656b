"""What the plugin's parts hand each other: the user-property keys a worker attaches to a test
report (the controller reads them back) and the ``config.stash`` keys of this process."""

from __future__ import annotations

import pytest

RECORD_KEY = "ddp_record"
EVENTS_KEY = "ddp_events"
CASE_KEY = "ddp_case"
HOSTNAMES = pytest.StashKey[list]()
#: This run's report.json dict, as the writer rendered it from memory: the verdict of record.
RUN_REPORT = pytest.StashKey[dict]()
#: The target error that stopped the run (its one line), for the report files to say what it is.
TARGET_ERROR = pytest.StashKey[str]()
INTERRUPTED = pytest.StashKey[bool]()
KEPT_TMP = pytest.StashKey[str]()
STARTUP = pytest.StashKey[float]()
