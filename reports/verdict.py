"""The verdict: one word for the whole run, and the exit code the CLI returns for it.

Tri-state on purpose (after jepsen's ``checker.clj`` validity priorities):
``failed`` outranks ``inconclusive`` outranks ``passed``. A run is *ready* only when it
positively showed something and nothing went wrong; a run that checked nothing, was killed
halfway or tripped over its own harness cannot vouch for the target, so it is
*inconclusive* — never *ready* (an empty test run is "unknown", as in sonobuoy).

Records may be :class:`reports.schema.CheckRecord` objects or their JSON dicts, so the same
rules apply to a live run and to a ``report.json`` read back from disk.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .schema import STATUSES, VERDICTS

READY, NOT_READY, INCONCLUSIVE = VERDICTS
USAGE = "usage"  # not a verdict: the run never started (bad input, a target that cannot load)

# The one exit-code table (README, "Command line"; docs/architecture.md, "Results"): the CLI
# imports these names and the HTML report receives the table from its renderer.
EXIT_CODES: dict[str, int] = {READY: 0, NOT_READY: 1, USAGE: 2, INCONCLUSIVE: 3}
EXIT_READY, EXIT_NOT_READY, EXIT_USAGE, EXIT_INCONCLUSIVE = (
    EXIT_CODES[READY], EXIT_CODES[NOT_READY], EXIT_CODES[USAGE], EXIT_CODES[INCONCLUSIVE])
HARNESS_KIND = "harness"


def _field(record: Any, name: str) -> Any:
    if isinstance(record, Mapping):
        return record.get(name)
    return getattr(record, name, None)


def status_of(record: Any) -> str:
    """The record's status; anything unrecognised counts as ``inconclusive`` (never passed)."""
    status = _field(record, "status")
    return status if status in STATUSES else "inconclusive"


def is_harness(record: Any) -> bool:
    """A ``kind="harness"`` record reports the suite's own failure, not the target's."""
    return _field(record, "kind") == HARNESS_KIND


def counts(records: Iterable[Any]) -> dict[str, int]:
    """Records per status, every status present (zeros included) so tables line up."""
    out = dict.fromkeys(STATUSES, 0)
    for record in records:
        out[status_of(record)] += 1
    return out


def reasons(records: Iterable[Any], *, complete: bool, harness_errors: Iterable[str] = ()) -> list[str]:
    """Why the verdict is what it is, most severe first: the lines under the verdict badge."""
    records = list(records)
    harness = [str(e) for e in harness_errors if str(e).strip()]
    checks = [r for r in records if not is_harness(r)]
    harness += [str(_field(r, "message") or _field(r, "id")) for r in records if is_harness(r)]
    tally = counts(checks)
    out: list[str] = []
    if tally["failed"]:
        ids = [str(_field(r, "id")) for r in checks if status_of(r) == "failed"]
        out.append(f"{tally['failed']} check(s) failed: {', '.join(ids)}")
    if not complete:
        out.append("the run did not finish (killed or crashed): only completed checks are reported")
    if harness:
        out.append(f"{len(harness)} harness error(s): the suite itself could not run everything")
    if tally["inconclusive"]:
        ids = [str(_field(r, "id")) for r in checks if status_of(r) == "inconclusive"]
        out.append(f"{tally['inconclusive']} check(s) inconclusive: {', '.join(ids)}")
    if tally["passed"] + tally["failed"] == 0:
        out.append("no check passed or failed: nothing was actually verified")
    if not out:
        out.append(f"all {tally['passed']} executed check(s) passed")
    return out


def decide(records: Iterable[Any], *, complete: bool, harness_errors: Iterable[str] = ()) -> str:
    """``ready`` | ``not-ready`` | ``inconclusive`` for a run.

    - any failed check → ``not-ready`` (a definite defect outranks everything else, even a
      crashed run: what was found is real);
    - else a harness error (argument or a ``kind="harness"`` record), an incomplete run, an
      inconclusive check, or no check that passed or failed (empty or all skipped) →
      ``inconclusive``;
    - else ``ready``.

    Harness records never make a run ``not-ready`` whatever their status: they say the suite
    broke, which says nothing about the target.
    """
    records = list(records)
    checks = [r for r in records if not is_harness(r)]
    tally = counts(checks)
    if tally["failed"]:
        return NOT_READY
    harness = any(str(e).strip() for e in harness_errors) or len(checks) != len(records)
    if harness or not complete or tally["inconclusive"] or tally["passed"] == 0:
        return INCONCLUSIVE
    return READY


def exit_code(verdict: str) -> int:
    """The CLI's exit status for a run's verdict (:data:`EXIT_CODES`; usage is not a verdict)."""
    if verdict not in VERDICTS:
        raise ValueError(f"verdict={verdict!r} is not one of {', '.join(VERDICTS)}")
    return EXIT_CODES[verdict]
