"""The verdict: one word for the whole run, and the exit code the CLI returns for it.

Tri-state on purpose (after jepsen's ``checker.clj`` validity priorities):
``failed`` outranks ``inconclusive`` outranks ``passed``. A run is *ready* only when it
positively showed something and nothing went wrong; a run that checked nothing, was killed
halfway or tripped over its own harness cannot vouch for the target, so it is
*inconclusive* — never *ready* (an empty test run is "unknown", as in sonobuoy).

**Ready means the training step was verified** (README, "Command line";
docs/architecture.md, "Results"). A run whose checks all passed is ready only when it verified
the training step itself, on every target:

1. every passed correctness (``conformance``) record says what it compared
   (``evidence.verified``, :data:`reports.keys.VERIFIED`) and each count reaches its minimum:
   more than one rank; for the equivalence checks at least one ``optimizer.step()``, a gradient
   that is not zero and an all-reduce observed (:func:`unverified`);
2. on every target a correctness check ran on, gradient-equivalence or no-sync-equivalence
   passed (:data:`EQUIVALENCE`). Rank agreement, eval agreement or a hang-free loop do not
   verify the step: every rank computing the same wrong gradient (a loss multiplied by the
   world size) agrees with itself. Equivalence checks that all skipped (no gradient reached
   the optimizer, every gradient zero) verified nothing either;
3. at least one correctness check passed (a perf- or chaos-only selection verifies nothing
   about correctness);
4. no selected check was left unrun by the mode while the target has its subject
   (``evidence.not_run_here``, :data:`reports.keys.NOT_RUN_HERE`: resume-equivalence on a
   target with a ``run_loop`` under ``--attach``): it was not verified, so it is listed first
   with the command that runs it (:func:`not_run`). Deselecting it (``--checks``) is how a
   user says it is not wanted.

**A node selection gives a node verdict.** A selection of node checks alone (:data:`NODE_CHECKS`,
``--checks node-health``) examines the node, not the training step: all passed is
*node-healthy* (exit 0, never *ready*), a failure is *not-ready* with the faulty rank in the
first line (:func:`node_only`). In a full run a failed node check is a failed check like any.

Otherwise the run is *inconclusive*, with the reason as the report's first line: what passed
on that target and what ready still needs. The rule reads records only (their status, kind,
target and ``verified`` counts), never a check's internals. A user may still select any
checks; the verdict just does not over-claim.

Records may be :class:`reports.schema.CheckRecord` objects or their JSON dicts, so the same
rules apply to a live run and to a ``report.json`` read back from disk.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from .keys import EXHAUSTED, NOT_RUN_HERE, VERIFIED
from .schema import STATUSES, VERDICTS

READY, NOT_READY, INCONCLUSIVE, NODE_HEALTHY = VERDICTS
USAGE = "usage"  # not a verdict: the run never started (bad input, a target that cannot load)

# The one exit-code table (README, "Command line"; docs/architecture.md, "Results"): the CLI
# imports these names and the HTML report receives the table from its renderer.
EXIT_CODES: dict[str, int] = {READY: 0, NOT_READY: 1, USAGE: 2, INCONCLUSIVE: 3, NODE_HEALTHY: 0}
EXIT_READY, EXIT_NOT_READY, EXIT_USAGE, EXIT_INCONCLUSIVE = (
    EXIT_CODES[READY], EXIT_CODES[NOT_READY], EXIT_CODES[USAGE], EXIT_CODES[INCONCLUSIVE])
HARNESS_KIND = "harness"
#: The correctness checks: their passes are what "ready" rests on.
CORRECTNESS_KIND = "conformance"
#: DDP's gradient contract, the training step verified: on every target one of them must pass.
EQUIVALENCE = ("gradient-equivalence", "no-sync-equivalence")
#: The checks of the node rather than the code: a selection of these alone gives a node verdict.
NODE_CHECKS = ("node-health",)
#: The least a ``verified`` count must reach for a pass to count (any count not named: 1).
MINIMUM = {"ranks": 2}
#: What a count below its minimum means, said in the report's first line.
_SHORT = {
    "ranks": "{value} rank: nothing was synchronised (run with --world-size 2 or more, or "
             "torchrun --nproc-per-node 2 or more)",
    "optimizer_steps": "{value} optimizer.step() calls: train_step never stepped the optimizer",
    "nonzero_gradients": "{value} non-zero gradients: every gradient was exactly zero (a loss "
                         "multiplied by 0, or detached from the parameters)",
    "allreduce_rounds": "{value} all-reduces observed: DDP never synchronised the gradients",
}


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


def _where(record: Any) -> str:
    target = _field(record, "target")
    return f"{_field(record, 'id')}" + (f" on {target}" if target else "")


def unverified(record: Any) -> str | None:
    """Why a passed correctness record verified nothing, or None: its ``verified`` counts are
    missing, or one of them is below its minimum (:data:`MINIMUM`)."""
    evidence = _field(record, "evidence")
    counted = evidence.get(VERIFIED) if isinstance(evidence, Mapping) else None
    if not isinstance(counted, Mapping) or not counted:
        return "the record does not say what it compared"
    short = []
    for name, value in counted.items():
        least = MINIMUM.get(str(name), 1)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= least:
            short.append(_SHORT.get(str(name), "{value} " + str(name)).format(value=value))
    return "; ".join(short) or None


def _passed_on(checks: list[Any], target: Any) -> str:
    """The checks that passed on ``target``, in run order: what was verified there."""
    ids = [str(_field(r, "id")) for r in checks if _field(r, "target") == target and status_of(r) == "passed"]
    return ", ".join(dict.fromkeys(ids))


def _step_unverified(checks: list[Any]) -> list[str]:
    """Rule 2: per target of a correctness record, why the training step was not verified there
    (targets in the same state said together); [] when an equivalence check passed on each."""
    targets = dict.fromkeys(_field(r, "target") for r in checks if _field(r, "kind") == CORRECTNESS_KIND)
    out: list[str] = []
    unchecked: dict[str, list[Any]] = {}  # what passed there -> the targets without an equivalence check
    for target in targets:
        ran = [r for r in checks if _field(r, "id") in EQUIVALENCE and _field(r, "target") == target]
        if any(status_of(r) == "passed" for r in ran):
            continue  # a pass that compared too little is rule 1's line, not this one's
        if ran and all(status_of(r) == "skipped" for r in ran):
            said = str(_field(ran[0], "message") or "").strip()
            out.append(f"DDP's gradients were not verified{f' on {target}' if target else ''}: "
                       f"{', '.join(str(_field(r, 'id')) for r in ran)} skipped" + (f" ({said})" if said else ""))
        elif not ran:
            unchecked.setdefault(_passed_on(checks, target), []).append(target)
    for passed, group in unchecked.items():
        named = ", ".join(str(t) for t in group if t)
        # What passed is said with why it is not enough: agreement is not correctness.
        said = (f"{passed} passed, but ready needs gradient-equivalence or no-sync-equivalence passed on "
                f"every target (the ranks agree on a wrong gradient too, e.g. a loss multiplied by the world "
                f"size)" if passed else
                "nothing passed, and ready needs gradient-equivalence or no-sync-equivalence passed on every "
                "target")
        out.append(f"the training step was not verified{f' on {named}' if named else ''}: {said}: "
                   f"add gradient-equivalence to --checks, or leave --checks out")
    return out


def not_run(records: Iterable[Any]) -> str | None:
    """Rule 4: the selected checks this mode could not run on a target that has their subject,
    each with the command that runs it, in one line; None when there are none."""
    unrun = []
    for record in records:
        evidence = _field(record, "evidence")
        said = evidence.get(NOT_RUN_HERE) if isinstance(evidence, Mapping) else None
        if status_of(record) == "skipped" and isinstance(said, Mapping):
            unrun.append((_where(record), str(said.get("mode") or "this mode"), str(said.get("command") or "")))
    if not unrun:
        return None
    modes = " and ".join(dict.fromkeys(mode for _, mode, _ in unrun))
    listed = "; ".join(f"{where} ({command})" if command else where for where, _, command in unrun)
    return (f"not verified: {len(unrun)} selected check(s) cannot run under {modes} but the target has what "
            f"they check: {listed}; run them so, or leave them out of --checks")


def gaps(records: Iterable[Any]) -> list[str]:
    """Why checks that all passed still did not verify the training step (the ready rule's
    1-4 above), most telling first; empty when the run verified it on every target."""
    checks = [r for r in records if not is_harness(r)]
    unrun = not_run(checks)
    out = [unrun] if unrun else []
    correct = [r for r in checks if _field(r, "kind") == CORRECTNESS_KIND and status_of(r) == "passed"]
    for record in correct:
        why = unverified(record)
        if why is not None:
            out.append(f"{_where(record)} passed without verifying DDP: {why}")
    out += _step_unverified(checks)
    if not correct and any(status_of(r) == "passed" for r in checks):
        ids = ", ".join(dict.fromkeys(str(_field(r, "id")) for r in checks))
        out.append(f"no correctness check passed: the checks that ran ({ids}) measure performance or "
                   f"diagnosis, not that DDP trains this model correctly; run the conformance checks "
                   f"too (leave --checks out, or add gradient-equivalence)")
    return out


def node_only(records: Iterable[Any]) -> bool:
    """Whether the checks (harness records aside) are node checks alone, at least one."""
    ids = [_field(r, "id") for r in records if not is_harness(r)]
    return bool(ids) and all(i in NODE_CHECKS for i in ids)


def _node_lines(checks: list[Any]) -> list[str]:
    """A node selection's first lines: what each node check found, faulty ranks first."""
    failed = [f"node unhealthy: {_field(r, 'message')}" for r in checks if status_of(r) == "failed"]
    healthy = [str(_field(r, "message")) for r in checks if status_of(r) == "passed"]
    return failed or healthy


def reasons(records: Iterable[Any], *, complete: bool, harness_errors: Iterable[str] = ()) -> list[str]:
    """Why the verdict is what it is, most severe first: the lines under the verdict badge."""
    records = list(records)
    harness = [str(e) for e in harness_errors if str(e).strip()]
    checks = [r for r in records if not is_harness(r)]
    harness += [str(_field(r, "message") or _field(r, "id")) for r in records if is_harness(r)]
    tally = counts(checks)
    node = node_only(checks)
    out: list[str] = _node_lines(checks) if node else []
    if tally["failed"]:
        ids = [str(_field(r, "id")) for r in checks if status_of(r) == "failed"]
        out.append(f"{tally['failed']} check(s) failed: {', '.join(ids)}")
    if not complete:
        out.append("the run did not finish (killed or crashed): only completed checks are reported")
    if harness:
        out.append(f"{len(harness)} harness error(s): the suite itself could not run everything")
    if tally["inconclusive"]:
        # The host ran out of something (disk, /dev/shm, file descriptors): said first, with the fix.
        out += list(dict.fromkeys(str(e[EXHAUSTED]) for r in checks if status_of(r) == "inconclusive"
                                  and isinstance(e := _field(r, "evidence"), Mapping) and e.get(EXHAUSTED)))
        ids = [str(_field(r, "id")) for r in checks if status_of(r) == "inconclusive"]
        out.append(f"{tally['inconclusive']} check(s) inconclusive: {', '.join(ids)}")
    if not tally["failed"] and not node:
        out += gaps(checks)
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
      inconclusive check, no check that passed or failed (empty or all skipped), or passes
      that verified nothing (:func:`gaps`) → ``inconclusive``;
    - a node selection (:func:`node_only`) that all passed → ``node-healthy``;
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
    if node_only(checks) and not harness and complete and tally["passed"] == len(checks):
        return NODE_HEALTHY
    if harness or not complete or tally["inconclusive"] or tally["passed"] == 0 or gaps(checks):
        return INCONCLUSIVE
    return READY


def exit_code(verdict: str) -> int:
    """The CLI's exit status for a run's verdict (:data:`EXIT_CODES`; usage is not a verdict)."""
    if verdict not in VERDICTS:
        raise ValueError(f"verdict={verdict!r} is not one of {', '.join(VERDICTS)}")
    return EXIT_CODES[verdict]
