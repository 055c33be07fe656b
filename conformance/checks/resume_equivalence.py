"""Check ``resume-equivalence``: a job killed and restarted continues exactly where it stopped.

    ddp-conformance run --checks resume-equivalence --target examples/train_resume.py

Contract (the production checklist; torchrun's elastic agent, a Slurm requeue): after a
failure the workers are restarted and resume from the last checkpoint, and training must go on
as if nothing happened — same parameters, optimizer state, learning rate, GradScaler state and
step count, and every sample trained exactly once. What breaks it in real code: optimizer,
scheduler or scaler state not saved or not loaded; the data order restarting at the epoch's
beginning; ``load_state_dict(strict=False)`` matching no key because of DDP's ``module.``
prefix; every rank writing one file in place, torn by a kill during the write.

What runs, each life in a fresh world (``resume``): the target's own ``run_loop`` with
``ctx.checkpoint_dir`` (empty at first), ``ctx.checkpoint_every`` and ``ctx.restarts``:
(a) uninterrupted for ``ctx.steps`` optimizer steps; (b) the whole world stopped after the
first step by which a checkpoint was complete, then a fresh world on the same folder resuming
to ``ctx.steps``; (c) the highest rank that saves SIGKILLed half-way through a ``torch.save``
into the folder (the second save round; its first save over a file an earlier round wrote when
the round has one, else its first save: a torn overwrite is what loses the previous checkpoint;
the others torn down), then restarted the same way.
Kill points are keyed by steps and saves, never by time. The kills' first lives are (a)
itself: at (b)'s point every rank waits while the checkpoint folder is copied
(``resume/life.py``, ``Steps._copy_here``), and at (c)'s the saving rank writes half its bytes
and stops its peers (SIGSTOP) while it copies the folder (``resume/observers.py``,
``Saves._torn_copy``); each copy is what a SIGKILL there leaves on disk, and each restart runs
on its copy under the same path, one after the other. (c)'s copy point is fixed before (a)
has planned the kill (rank 0, the second save round: the common loop), so when the plan
differs (a peer saves beside it) or a copy was not made, that scenario's first life is a
world SIGKILLed at the point. That saves two worlds and two lives. What it costs against one
uninterrupted run: benchmarks/resume_cost.py (README). Every life's model runs with dropout
and stochastic depth off (as the equivalence checks compare dropout): a loop need not save
torch's RNG state to resume. Randomness that cannot be switched off is measured, and a
restart that draws it from another RNG state is a warning, not a finding: in forward (torch's
RNG moved during the step: random masking, noise), or in the data pipeline (the same dataset
indices, other content: a random augmentation; who the samples are is read from the
DataLoader's sampler). A restart that no step could be compared for is inconclusive, never
passed. On every rank and every resumed step the judge compares the restored state at the
step's entry, the samples, and the state where ``optimizer.step()`` returned with the
uninterrupted run; the whole run's samples as a multiset (by dataset index when a random
augmentation makes the content new at every draw).

Skipped: no ``run_loop``; a loop that writes nothing in ``ctx.checkpoint_dir``; under
``--attach`` (the launcher owns the restart) a loop that saves (one uninterrupted run in the
launched world, ``resume/probe.py``), where the record names the command that runs it locally
and the run is inconclusive unless the check was deselected (the loop saves, but resuming it
was not verified: docs/architecture.md, "Results").

Evidence: per scenario the kill, where each rank resumed, steps compared, findings (what,
rank, step, cause), warnings, the samples multiset; metrics: ``resume_trajectories`` (rank 0's
parameter norm per step: the report's chart), ``steps_compared``.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ddp_conformance.reports.keys import RESUME_TRAJECTORIES, VERIFIED, WARNINGS

from ..harness.context import CheckContext
from ..harness.failures import world_error_outcome
from ..harness.outcome import Outcome
from ..harness.timing import MIDRUN_PG_TIMEOUT_S
from ..harness.world import RankFailure, WorldHang
from .resume import (
    KILLED_BETWEEN,
    KILLED_DURING_SAVE,
    UNINTERRUPTED,
    Finding,
    KillPlan,
    Life,
    Lives,
    Run,
    Verdict,
    between_steps_plan,
    copied_at,
    during_save_plan,
    files_in,
    judge_run,
    saves_in_checkpoint_dir,
    worlds_ahead,
)

#: ``ctx.steps`` of every life: enough for a checkpoint, a step after it, and a second save round.
STEPS = 6
#: ``ctx.checkpoint_every``: saves after steps 2, 4 and 6.
EVERY = 2
#: The key figure of a finding, by what differed.
HEADLINES = {"parameters": "parameters differ", "optimizer": "optimizer state differs",
             "lr": "learning rate differs", "scaler": "GradScaler state differs", "samples": "other samples trained",
             "steps": "steps repeated or lost", "raised": "run_loop raised on restart"}
NOTHING_WRITTEN = (f"run_loop wrote nothing in ctx.checkpoint_dir over {{steps}} (ctx.checkpoint_every={EVERY}): "
                   f"there is no checkpoint to resume from; save there and resume from it at start-up "
                   f"(ctx.tmpdir is each rank's own and is not kept across a restart; see examples/train_resume.py)")
ATTACHED = "under --attach the launcher (torchrun, srun) owns the restart, and the suite cannot kill and restart its ranks"


def run(ctx: CheckContext) -> Outcome:
    if not ctx.target.has("run_loop"):
        return Outcome.skipped("the target defines no run_loop: there is no loop to kill and restart (define "
                               "run_loop(ctx) with checkpoints in ctx.checkpoint_dir, see examples/train_resume.py)")
    if ctx.new_world is None:
        return _attached(ctx)
    folder = Path(tempfile.mkdtemp(prefix="resume-", dir=ctx.tmpdir))
    try:
        return _experiment(ctx, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # the journals and every checkpoint written


def _attached(ctx: CheckContext) -> Outcome:
    """Under --attach: a loop that saves is there, so resuming it is not verified (the verdict
    lists the check with its command); a loop that saves nothing has nothing to resume."""
    try:
        # In the launched world, the only one there is (as rank-consistency runs the loop).
        written = [r.value for r in ctx.world().run(saves_in_checkpoint_dir, ctx.target.spec, steps=STEPS,
                                                     every=EVERY, deadline=ctx.deadline)]
    except (RankFailure, WorldHang) as exc:
        return world_error_outcome(exc, "the target's run_loop (looking for its checkpoints)")
    if not any(written):
        return Outcome.skipped(NOTHING_WRITTEN.format(steps=f"a run of ctx.steps={STEPS}"))
    return Outcome.not_run_here(ATTACHED, check="resume-equivalence", target=ctx.target.spec)


def _experiment(ctx: CheckContext, folder: Path) -> Outcome:
    with Lives(lambda: ctx.fresh_world(pg_timeout=MIDRUN_PG_TIMEOUT_S), ctx.target.spec, folder, STEPS,
               EVERY, ctx.deadline, ahead=worlds_ahead(ctx.world_size)) as lives:
        return _scenarios(ctx, lives)


def _scenarios(ctx: CheckContext, lives: Lives) -> Outcome:
    size = ctx.world_size
    try:
        # A world for the next life starts while this loop runs (closed unused when the loop
        # writes no checkpoint: the check then skips). The checkpoint folder is copied at both
        # kill points (the first lives of the kill scenarios: Lives.from_copy).
        a, failure = lives.one(UNINTERRUPTED, 1, KillPlan("none"), size, more=1, copy=True)
    except WorldHang as exc:
        return world_error_outcome(exc, "the target's run_loop (uninterrupted)")
    if failure is not None:
        return world_error_outcome(failure, "the target's run_loop (uninterrupted)")
    if not any(life.steps for life in a):
        return Outcome.skipped("run_loop took no optimizer step: there is nothing to resume")
    written = files_in(lives.checkpoints(UNINTERRUPTED))
    if not written:
        return Outcome.skipped(NOTHING_WRITTEN.format(steps=f"{len(a[0].steps)} optimizer steps"))
    plans = {KILLED_BETWEEN: between_steps_plan(a), KILLED_DURING_SAVE: during_save_plan(a)}
    skipped = {scenario: plan for scenario, plan in plans.items() if isinstance(plan, str)}
    kills = {scenario: plan for scenario, plan in plans.items() if not isinstance(plan, str)}
    runs = _killed(lives, a, kills, size)
    verdicts: list[Verdict] = []
    for scenario, plan in kills.items():
        killed = runs[scenario]
        if isinstance(killed, WorldHang):
            return world_error_outcome(killed, f"the target's run_loop ({scenario}, restarted)")
        if (problem := _unplanned(killed)) is not None:
            return problem
        if not killed.kill_fired:
            skipped[scenario] = f"the planned kill ({plan.kind} at step {plan.step}) was not reached this time"
            continue
        verdicts.append(judge_run(a, killed, lives.folder))
    return _outcome(verdicts, skipped, written, len(a[0].steps))


def _killed(lives: Lives, a: list[Life], kills: dict[str, KillPlan], size: int) -> dict[str, Run | WorldHang]:
    """The kill scenarios' lives. Where the uninterrupted run copied its checkpoint folder at
    the kill point, that run stopped there is the scenario's first life (``Lives.from_copy``)
    and only the restart runs; those restarts run one after the other (each under the path the
    uninterrupted run wrote to). A scenario with no copy (a kill during a save that a peer
    saves beside, a rank that never answered) kills a first life for real, beside them."""
    def guarded(run: Callable[[], Run]) -> Run | WorldHang:
        try:
            return run()
        except WorldHang as exc:
            return exc

    copied = [name for name, plan in kills.items() if copied_at(a, plan)]
    real = [name for name in kills if name not in copied]

    def from_copies() -> dict[str, Run | WorldHang]:
        return {name: guarded(lambda: lives.from_copy(a, kills[name], size, more=len(copied) - 1 - i))
                for i, name in enumerate(copied)}

    def killed(name: str) -> Callable[[], dict[str, Run | WorldHang]]:
        return lambda: {name: guarded(lambda: lives.killed(name, kills[name], size))}

    if not kills:
        return {}
    # The uninterrupted life launched a world for the first restart; one more for each first
    # life that runs for real.
    lives.launch(len(real), added=True)
    jobs = {name: killed(name) for name in real}
    if copied:
        jobs["from-copies"] = from_copies
    return {name: run for result in lives.side_by_side(jobs).values() for name, run in result.items()}


def _unplanned(run: Run) -> Outcome | None:
    """Life 1 failed otherwise than by the planned kill (its own exception or DDP's): the loop
    does not run to its kill point, a finding of the first start, not of the restart. A
    restart whose ranks died without the loop raising (a world failure, not the loop's) is
    not judged either: its journals stop where it died."""
    if run.failure is not None and len(run.lives) > 1 and not any(life.ended == "raised" for life in run.restart):
        return world_error_outcome(run.failure, f"the target's run_loop ({run.scenario}, restarted)")
    raised = [life for life in run.first if life.ended == "raised"]
    if not raised:
        return None
    life = raised[0]
    return Outcome.failed(f"run_loop raised on rank {life.rank} before the planned kill ({run.scenario}): "
                          f"{life.raised}", metrics={"key_figure": "run_loop raised"})


def _advice(failing: list[tuple[Verdict, Finding]]) -> str:
    """One fix per cause found, the first scenario's first: a loop with two bugs (an optimizer
    never saved, a checkpoint written in place) shows both at a restart, and advice for one of
    them leaves the user to find the other by the next failed run."""
    fixes: dict[str, list[str]] = {}
    for verdict, finding in failing:
        if finding.recommendation:
            fixes.setdefault(finding.recommendation, []).append(verdict.scenario)
    said = [f"{fix[:1].upper()}{fix[1:]} ({', '.join(scenarios)})." for fix, scenarios in fixes.items()]
    return " ".join(said[:1] + [f"Also: {s[:1].lower()}{s[1:]}" for s in said[1:]])


def _outcome(verdicts: list[Verdict], skipped: dict[str, str], written: list[str], steps: int) -> Outcome:
    compared = sum(v.steps_compared for v in verdicts)
    metrics: dict[str, Any] = {"steps_compared": compared,
                               RESUME_TRAJECTORIES: {v.scenario: v.trajectory for v in verdicts}}
    evidence: dict[str, Any] = {"scenarios": {v.scenario: v.as_dict() for v in verdicts},
                                "scenarios_skipped": skipped, "checkpoint_files": written[:20],
                                "steps": steps, "checkpoint_every": EVERY,
                                WARNINGS: [w for v in verdicts for w in v.warnings]}
    if not verdicts:
        return Outcome.skipped("no kill scenario could run: " + "; ".join(f"{k}: {v}" for k, v in skipped.items()),
                               metrics=metrics, evidence=evidence)
    failing = [(v, v.findings[0]) for v in verdicts if v.findings]
    if failing:
        parts = []
        for verdict, finding in failing:
            cause = finding.cause or f"no known cause matched (evidence: scenarios.{verdict.scenario}.findings)"
            parts.append(f"{verdict.scenario} ({verdict.kill}): {finding.message}; {cause}")
        first = failing[0][1]
        where = f" at step {first.step}" if first.step else ""
        metrics.update(key_figure=f"{HEADLINES[first.what]}{where} on rank {first.rank}",
                       first_divergence=first.as_dict())
        return Outcome.failed("restart not equivalent to the uninterrupted run: " + " | ".join(parts),
                              metrics=metrics, evidence=evidence, recommendation=_advice(failing))
    if compared == 0:  # e.g. randomness other than dropout not restored: nothing was compared
        why = "; ".join(evidence[WARNINGS]) or "every restart ended before a resumed step"
        return Outcome.inconclusive(f"no resumed step could be compared with the uninterrupted run: {why}",
                                    metrics=metrics, evidence=evidence)
    said = []
    for v in verdicts:
        start = min(v.resumed_at.values(), default=steps + 1)
        counts = next(iter(v.samples.values()), {})
        if not v.steps_compared:  # a warning says why (a random stream, another start): no "equal" claimed
            said.append(f"{v.scenario} ({v.kill}): resumed at step {start}, no step compared (see the warnings)")
            continue
        said.append(f"{v.scenario} ({v.kill}): resumed at step {start}, equal to step {steps} on "
                    f"{len(v.resumed_at)} ranks ({counts.get('trained', 0)} samples per rank, "
                    f"{counts.get('repeated', 0)} repeated, {counts.get('missed', 0)} missed)")
    skipped_text = "".join(f"; {k} not run: {v}" for k, v in skipped.items())
    warned = " (with warnings)" if evidence[WARNINGS] else ""
    metrics["key_figure"] = f"{compared} resumed steps equal{warned}"
    warnings = "".join(f"; warning: {w}" for w in evidence[WARNINGS])
    # What this pass compared, for the verdict's "ready means verified" rule (reports/verdict.py).
    evidence[VERIFIED] = {"ranks": min((len(v.resumed_at) for v in verdicts), default=0),
                          "resumed_steps_compared": compared,
                          "restarts": sum(1 for v in verdicts if v.steps_compared)}
    some = " compared" if any(not v.steps_compared for v in verdicts) else ""
    return Outcome.passed("parameters, optimizer state, learning rates, GradScaler state, step count and samples "
                          f"equal to the uninterrupted run at every resumed step{some}: " + "; ".join(said) + skipped_text
                          + warnings,
                          metrics=metrics, evidence=evidence)
