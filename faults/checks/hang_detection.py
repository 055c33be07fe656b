"""Check ``hang-detection``: a hang is detected within the deadline and its culprit named.

Contract enforced (DDP docstring, torch/nn/parallel/distributed.py): forward and backward are
synchronisation points -- every rank must issue the same collectives in the same order, with
the same shapes; a rank that skips one (a branch not taken, a collective skipped, an epoch
shorter than its peers', a crash) leaves its peers waiting until the process-group timeout.

Injected mode runs six scenarios in one fresh world: a rank-dependent branch in DDP
(unused parameters), a skipped all-reduce, an all-reduce with a different shape, a rank dying
inside backward, one rank with fewer batches -- a rank that never entered the collective
(application divergence) -- and a rank frozen inside the all-reduce, as a stalled transport or
driver leaves it (entered on every rank, completed on none). It passes iff every fault fired
and the diagnosis names the injected rank and class (and, for DDP, the bucket and parameters),
within the deadline. Target mode runs the target's ``run_loop`` (or a default few-step loop of
its model, data and ``train_step``) and fails when it hangs or raises, with the diagnosis; a
hang in which the ranks ran different numbers of training batches (counted per rank) is named
uneven inputs, with Join advised. A run_loop that completes with ``Join`` over uneven inputs is
re-run with Join a no-op context, to show the hang it prevents (culprit rank and collective).
A loop that completes is a pass only if the target's code exercised training on every rank: the
run_loop wrapped a model with ``ctx.wrap``, and the loop (run_loop, or the default loop's
train_step) ran a training forward, took an ``optimizer.step()`` and issued a gradient reduction
(DDP's bucket all-reduce; FSDP2's reduce-scatter or all-reduce, named so in the message)
(counted as it runs, ``scenarios.EXERCISED``); one that did not (``def run_loop(ctx): return``,
a train_step that does nothing) is skipped with what it did not do, and a pass says the counts.

Evidence: per-scenario classification (divergence | transport | dead-rank | error), culprit
rank, collective (sequence number, op, shape, tag, DDP bucket and its parameter names), DDP's
unused-parameter names, the monitored-barrier answer, torch's flight recorder per answering
rank (last entries: sequence number, op, input shapes, state; last enqueued vs completed),
stack excerpts, detection latency.

    ddp-conformance run --checks hang-detection
    ddp-conformance run --target branchy --checks hang-detection
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from conformance.harness.context import CheckContext
from conformance.harness.load import contention
from conformance.harness.outcome import Outcome
from conformance.harness.timing import DETECTION_SLACK_S, STALL_DEADLINE_S
from ddp_conformance.reports.keys import CULPRIT_RANK, FEATURES

from .._log import record_injections
from ..diagnosis import HangDiagnosis
from ..injectors import (
    ConditionalBranch,
    DeadRank,
    SkipCollective,
    StalledRank,
    UnevenBatches,
)
from ..scenarios import (
    EXERCISED,
    Scenario,
    ScenarioResult,
    run_scenario,
    run_scenarios,
    scenario_deadline,
    scenario_world,
)
from ..vehicles import VehicleSpec

# The branch vehicle uses tiny buckets so the stuck bucket holds the aux head's parameters
# only (after DDP's rebuild at step 1), which makes "bucket -> parameter names" checkable.
BRANCH_VEHICLE = VehicleSpec(
    kind="branchy", branch=ConditionalBranch(ranks=(1,), steps=(2,), skip=True),
    ddp_kwargs=(("find_unused_parameters", False), ("bucket_cap_mb", 0.0001)))
SMALL_MLP = VehicleSpec(kind="mlp", width=32, depth=3)


def injected_scenarios() -> list[tuple[Scenario, dict[str, Any]]]:
    """Each scenario with what a correct diagnosis must say about it."""
    aux = set(BRANCH_VEHICLE.aux_parameter_names)
    return [
        (Scenario("rank-dependent-branch", "ddp", BRANCH_VEHICLE, BRANCH_VEHICLE.branch, steps=4),
         {"classification": "divergence", "culprit_rank": 1, "params_subset_of": aux, "unused": {1: aux}}),
        (Scenario("skipped-collective", "collectives", fault=SkipCollective(rank=1, step=1), steps=4),
         {"classification": "divergence", "kind": "skipped-collective", "culprit_rank": 1, "tag": "step1"}),
        (Scenario("shape-mismatch", "collectives", fault=SkipCollective(rank=1, step=1, shape_mismatch=True),
                  steps=3),
         {"classification": "divergence", "kind": "shape-mismatch", "culprit_rank": 1, "tag": "step1"}),
        (Scenario("dead-rank", "ddp", SMALL_MLP, DeadRank(rank=1, step=1, phase="backward"), steps=3),
         {"classification": "dead-rank", "culprit_rank": 1}),
        (Scenario("uneven-batches", "ddp", SMALL_MLP, UnevenBatches(rank=1, batches=2), steps=3),
         {"classification": "divergence", "kind": "never-entered", "culprit_rank": 1}),
        # Last on purpose: the frozen rank can only be killed, which forces a world restart;
        # here the world closes right after, so the restart is never paid.
        (Scenario("stalled-transport", "collectives", fault=StalledRank(rank=1, step=1), steps=3,
                  deadline_s=STALL_DEADLINE_S),
         {"classification": "transport", "kind": "entered-never-completed", "culprit_rank": 1,
          "tag": "step1"}),
    ]


def judge(result: ScenarioResult, expected: dict[str, Any], *, pace: float = 1.0) -> list[str]:
    """What is wrong with a diagnosis (empty: diagnosis == injection, within the deadline).

    ``pace``: the host's measured contention (``conformance.harness.load.contention``, 1.0 on a
    quiet host). The slack after the deadline is the supervisor's own work (every rank's stack,
    the kill), CPU work that takes ``pace`` times longer on a loaded host, so it is scaled by it,
    as the project's own tests scale their bounds: a busy CI runner is not a late detection."""
    d, problems = result.diagnosis, []
    fault = result.scenario.fault
    if fault is not None and not any(i.name == fault.name for i in result.injections):
        problems.append(f"the fault never fired: no rank recorded a {fault.name} injection")
    for key in ("classification", "kind", "culprit_rank"):
        if key in expected and getattr(d, key) != expected[key]:
            problems.append(f"{key} {getattr(d, key)!r} != injected {expected[key]!r}")
    if "tag" in expected and d.collective.get("tag") != expected["tag"]:
        problems.append(f"collective {d.collective.get('tag')!r} != injected {expected['tag']!r}")
    if "params_subset_of" in expected and (not d.params or not set(d.params) <= expected["params_subset_of"]):
        problems.append(f"stuck bucket params {d.params} are not the aux head's")
    for rank, names in expected.get("unused", {}).items():
        if set(d.unused.get(rank, [])) != names:
            problems.append(f"rank {rank} unused {d.unused.get(rank)} != {sorted(names)}")
    slack = DETECTION_SLACK_S * max(1.0, pace)
    if result.latency_s > result.deadline + slack:
        scaled = f" (x{pace:.2g} host contention)" if pace > 1.0 else ""
        problems.append(f"detected after {result.latency_s:.1f} s > deadline {result.deadline:g} s "
                        f"+ {slack:.2g} s{scaled}")
    return problems


def _entry(result: ScenarioResult, problems: list[str] | None = None) -> dict[str, Any]:
    out = {"scenario": result.scenario.name, "latency_s": round(result.latency_s, 3),
           "injections": len(result.injections), "rank_timings": result.timings,
           **result.diagnosis.as_dict(),
           "states": [{"rank": s.rank, "state": s.state, "text": s.text[-600:]} for s in result.states],
           "flight_recorder_dump": {str(r): f for r, f in sorted(result.flight.items())}}
    if problems is not None:
        out["problems"] = problems
    return out


def _stacks_excerpt(result: ScenarioResult) -> dict[str, str]:
    return {str(rank): text[-1500:] for rank, text in result.stacks.items()}


def run(ctx: CheckContext) -> Outcome:
    if ctx.new_world is None:
        why = "hang scenarios need a supervisor that can kill a hung world, which --attach does not have"
        if ctx.injected:  # the suite's own vehicles: nothing of the target goes unverified
            return Outcome.skipped(why)
        # The target's loop (run_loop, or its train_step's) is there: its hangs were not looked for.
        return Outcome.not_run_here(why, check="hang-detection", target=ctx.target.spec)
    return _injected(ctx) if ctx.injected else _target(ctx)


#: Scenarios the CI subset (``--suite ci``) leaves to the full suite, so that the subset stays at
#: most half the full suite's wall time on the built-ins (benchmarks/ci_wall_time.py --full).
#: CI keeps one hang per diagnosis path -- a DDP bucket never reduced (rank, bucket, parameter
#: names), a collective told apart by its tag (shape-mismatch), a dead rank -- and leaves the
#: ones that wait out a timeout for a path CI already covers: a skipped all-reduce and a rank
#: out of batches (2 s of subgroup timeout each, the same divergence class as the branch) and
#: the frozen transport (its 8 s deadline and a world restart: a fault of the node, not of the
#: training code a CI gate judges). With --target, hang-detection runs the target's own loop in
#: either suite; these are only the built-ins' injected hangs.
FULL_SUITE_ONLY = ("skipped-collective", "uneven-batches", "stalled-transport")


def _injected(ctx: CheckContext) -> Outcome:
    entries, bad, stacks = [], [], {}
    cases = injected_scenarios()
    left = [sc.name for sc, _ in cases if ctx.suite == "ci" and sc.name in FULL_SUITE_ONLY]
    cases = [(sc, expected) for sc, expected in cases if sc.name not in left]
    results = run_scenarios(ctx, [sc for sc, _ in cases])
    # Measured as the scenarios end, on the host they ran on: what the detection slack scales by.
    pace = contention()
    for (scenario, expected), result in zip(cases, results):
        record_injections(ctx, result.injections)
        problems = judge(result, expected, pace=pace)
        entries.append(_entry(result, problems))
        if problems:
            bad.append(f"{scenario.name}: {'; '.join(problems)}")
            stacks[scenario.name] = _stacks_excerpt(result)
    worst = max(e["latency_s"] for e in entries)
    metrics = {"key_figure": f"{len(entries) - len(bad)}/{len(entries)} hangs diagnosed, worst {worst:.1f} s",
               "scenarios": len(entries), "diagnosed": len(entries) - len(bad),
               "max_detection_latency_s": worst, "host_contention": round(pace, 2),
               "latency_s": {e["scenario"]: e["latency_s"] for e in entries},
               **({"left_to_full_suite": left} if left else {})}
    # Said in the message too: a CI pass covers fewer hang classes than a full one.
    rest = f" ({', '.join(left)}: run by --suite full)" if left else ""
    evidence = {"scenarios": entries, **({"stacks": stacks} if stacks else {})}
    if bad:
        return Outcome.failed(f"{len(bad)} injected hang(s) not diagnosed correctly: {' | '.join(bad)}{rest}",
                              metrics=metrics, evidence=evidence)
    return Outcome.passed(
        f"all {len(entries)} injected hangs detected within {worst:.1f} s and the culprit rank, "
        f"collective and bucket parameters named{rest}", metrics=metrics, evidence=evidence,
        recommendation="Keep process-group timeouts short in production and enable "
                       "TORCH_DISTRIBUTED_DEBUG=INFO so a hang names its parameters; use Join for "
                       "uneven inputs.")


RECOMMENDATIONS = {
    "divergence": "Make every rank issue the same collectives: remove rank- or data-dependent "
                  "branches (or make every parameter participate and set "
                  "find_unused_parameters=False), and use torch.distributed.algorithms.Join for "
                  "uneven batch counts.",
    "dead-rank": "A rank died: find its error (OOM, signal) and restart with torchrun's elastic "
                 "agent; evict the node if it repeats.",
    "transport": "Every rank entered the collective but it never completed: check the network "
                 "(NCCL_DEBUG=INFO, NIC/link errors) and evict the slow or broken node.",
    "error": "The loop raised: fix the error; with DDP, an error at the next forward after an "
             "unused parameter is fixed by making every parameter participate.",
}


def _batches_text(result: ScenarioResult) -> str:
    return ", ".join(f"rank {r} {n}" for r, n in sorted(result.batches().items()))


def _described(result: ScenarioResult) -> str:
    """The diagnosis in words; for a rank that never entered a collective because it ran out of
    batches (measured: it ran the fewest), that is said instead of how it ended afterwards (a
    later collective of the user's code timing out on it is a consequence, not the cause)."""
    d, batches = result.diagnosis, result.batches()
    if (d.kind == "never-entered" and result.uneven() and d.culprit_rank in batches
            and batches[d.culprit_rank] == min(batches.values())):
        d = replace(d, detail=f"rank {d.culprit_rank} ran out of data after {batches[d.culprit_rank]} training "
                              f"batches and left the loop; its peers went on into collective "
                              f"#{d.collective.get('seq')}")
    return d.describe()


#: What a loop that exercised nothing should do instead, by what ran (the target's run_loop, or
#: the default loop of its train_step).
IDLE_RECOMMENDATIONS = {
    "run_loop": "run_loop(ctx) should run ctx.steps steps of the production loop: wrap the model with "
                "ctx.wrap(model), then forward, backward and optimizer.step() each step",
    "ddp": "train_step(model, optimizer, microbatches, loss_fn) should run forward and backward over the "
           "microbatches through the model it is given, then call optimizer.step()",
}

UNEVEN_RECOMMENDATION = ("The ranks run different numbers of batches (uneven inputs): wrap the loop in "
                         "torch.distributed.algorithms.Join([model]) (and every other joinable, e.g. a "
                         "ZeroRedundancyOptimizer), or give every rank the same number of batches "
                         "(DistributedSampler pads or drops to equal shards).")


def _target(ctx: CheckContext) -> Outcome:
    target = ctx.target
    kind = "run_loop" if target.has("run_loop") else "ddp"
    # The default loop uses 2 samples per rank: small per-rank batches are where data-dependent
    # branches diverge across ranks (an MBS of 1-2 is common in LLM training), while BatchNorm
    # still accepts them.
    scenario = Scenario(f"target-{kind}", kind, target.spec, None, steps=4, per_rank=2)
    with scenario_world(ctx) as world:
        result = run_scenario(ctx, world, scenario, deadline=scenario_deadline(ctx))
        # Join over uneven inputs, measured (the ranks ran different numbers of batches): the
        # same loop again with Join a no-op context shows the hang it prevents. Last in the
        # world on purpose: the hang breaks the scenario's subgroup, and the world closes after.
        without = None
        if result.diagnosis.classification == "none" and result.joins() and result.uneven():
            without = run_scenario(ctx, world, Scenario("target-run_loop-without-join", "run_loop", target.spec,
                                                        steps=4, per_rank=2, without_join=True),
                                   deadline=scenario_deadline(ctx))
    d = result.diagnosis
    entry = {**_entry(result), "batches_per_rank": {str(r): n for r, n in result.batches().items()},
             "join_contexts": result.joins()}
    source = "its run_loop" if kind == "run_loop" else "a default 4-step loop of its train_step (2 samples per rank)"
    metrics = {"key_figure": "no hang" if d.classification == "none"
               else f"{d.classification}: rank {d.culprit_rank} after {result.latency_s:.1f} s",
               "detection_latency_s": round(result.latency_s, 3), "classification": d.classification,
               CULPRIT_RANK: d.culprit_rank}
    evidence: dict[str, Any] = {"scenarios": [entry], "stacks": _stacks_excerpt(result)}
    if result.joins():  # the configuration table's Join row: this run and its re-run verify it
        evidence[FEATURES] = {"join": {"used": True, "value": f"{result.joins()} block(s) in run_loop",
                                       "where": f"run_loop (training batches per rank: {_batches_text(result)})"}}
    exercised = result.exercised()
    if exercised:
        entry["exercised"] = exercised
    if d.classification == "none" and exercised and not all(exercised.values()):
        # A loop that returned without training verified nothing about hangs: never a pass.
        idle = _idle(exercised, result.fsdp2_issued())
        metrics["key_figure"] = "run_loop exercised nothing"
        return Outcome.skipped(
            f"{target.name}: {source} completed on every rank in {result.latency_s:.1f} s but {idle} "
            f"(fewest on any rank: {_exercised_text(exercised, result.fsdp2_issued())}): a loop that trains nothing cannot hang "
            f"where training would, so nothing about hangs was verified", metrics=metrics, evidence=evidence,
            recommendation=IDLE_RECOMMENDATIONS[kind])
    if d.classification == "none":
        message = f"{target.name}: {source} completed on every rank in {result.latency_s:.1f} s; no hang"
        if exercised:
            message += f" ({_exercised_text(exercised, result.fsdp2_issued())}, the fewest on any rank)"
        if without is not None:
            message += "; " + _join_shown(without, result, evidence)
            metrics["key_figure"] = ("no hang; Join prevents one" if without.diagnosis.classification != "none"
                                     else "no hang")
        return Outcome.passed(message, metrics=metrics, evidence=evidence)
    uneven = d.classification == "divergence" and result.uneven()
    cause = (f" -- uneven inputs: the ranks ran different numbers of training batches ({_batches_text(result)})"
             f"{' with no Join around the loop' if not result.joins() else ''}" if uneven else "")
    return Outcome.failed(f"{target.name}: {source} did not complete{cause} -- {_described(result)} "
                          f"(detected after {result.latency_s:.1f} s)", metrics=metrics,
                          evidence=evidence,
                          recommendation=UNEVEN_RECOMMENDATION if uneven else _advice(d))


def _advice(d: HangDiagnosis) -> str:
    """The fix for the cause measured first: parameters DDP's error named as producing no
    gradient on a rank (that rank raised before the all-reduce its peers entered), then the
    classification's general advice as the details."""
    if d.classification != "divergence" or not d.unused:
        return RECOMMENDATIONS[d.classification]
    names = sorted({n for names in d.unused.values() for n in names})
    ranks = ("rank " if len(d.unused) == 1 else "ranks ") + ", ".join(str(r) for r in sorted(d.unused))
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    return (f"Make {shown} receive a gradient on every rank at every step ({ranks} produced none, so it "
            f"never reached the all-reduce its peers waited in): remove the data-dependent branch that skips "
            f"them, or set find_unused_parameters=True in ddp_kwargs. " + RECOMMENDATIONS[d.classification])


def _exercised_text(exercised: dict[str, int], fsdp2: dict[str, int]) -> str:
    """What a run_loop did, in words: ``2 models wrapped, 4 training batches, ...``; the
    collectives by what the wrapper issued (``fsdp2``: FSDP2's, by kind, from
    ``ScenarioResult.fsdp2_issued``; DDP's bucket all-reduces otherwise)."""
    words = {"models_wrapped": "model(s) wrapped", "batches": "training batches",
             "optimizer_steps": "optimizer steps", "allreduces": "DDP all-reduces"}
    said = {name: f"{exercised[name]} {words[name]}" for name in EXERCISED}
    if fsdp2:
        said["allreduces"] = " and ".join(f"{n} {kind}" for kind, n in fsdp2.items() if n) + " issued by FSDP2"
    return ", ".join(said.values())


def _idle(exercised: dict[str, int], fsdp2: dict[str, int]) -> str:
    """What a loop that exercised nothing did not do (:data:`EXERCISED`), its gradient
    reductions named by the wrapper that should have issued them."""
    why = {**EXERCISED, **({"allreduces": "issued no gradient reduce-scatter or all-reduce through FSDP2"}
                           if fsdp2 else {})}
    return "; ".join(why[name] for name in EXERCISED if not exercised[name])


def _join_shown(without: ScenarioResult, result: ScenarioResult, evidence: dict[str, Any]) -> str:
    """What the re-run with Join disabled showed, said and recorded."""
    d = without.diagnosis
    evidence["scenarios"].append({**_entry(without),
                                  "batches_per_rank": {str(r): n for r, n in without.batches().items()}})
    evidence["join"] = {"uneven_batches_per_rank": {str(r): n for r, n in result.batches().items()},
                        "without_join": d.classification, "culprit_rank": d.culprit_rank,
                        "collective": d.collective, "detection_latency_s": round(without.latency_s, 3)}
    if d.classification == "none":
        return (f"the ranks ran uneven numbers of batches ({_batches_text(result)}) inside Join, and "
                f"the re-run with Join disabled completed too: Join was not needed for this loop")
    return (f"uneven inputs ({_batches_text(result)} batches) are handled by Join: re-run with Join "
            f"disabled, the loop hangs -- {_described(without)} (detected after {without.latency_s:.1f} s)")
