"""Check ``unused-parameters``: conditional branches, the hang they cause, and the cost of the fix.

Contract (DDP docstring): with ``find_unused_parameters=False`` every parameter must receive a
gradient in every iteration on every rank; a parameter that does not never marks its bucket
ready, so the peers' all-reduce of that bucket waits forever (the incident of docs/ddp-background.md:
an auxiliary head under ``random.random() > 0.5``). ``static_graph=True`` requires the same
graph in every iteration.

1. Discovery, without DDP (nothing can hang): every rank runs forward/backward on its own
   chunk of seeded global batches (and, for targets, on single samples) and records which
   parameters end with ``grad is None`` -- which parameters, on which ranks and steps. It runs
   in the fresh world of steps 2-4 and leaves its seeded model to the next call there (the
   tax, or the static_graph re-run where no tax is measured: ``_kept_model``).
2. Reproduction, in a fresh world with a short timeout: the configured ``ddp_kwargs`` on the
   same data, as production would run it; the error text (parameter names parsed from DDP's
   error under ``TORCH_DISTRIBUTED_DEBUG=INFO``) or the hang, diagnosed like hang-detection.
3. Tax: ``find_unused_parameters=True`` vs ``False`` on a step where every parameter is used,
   in True/False/True blocks of the noise floor's count of timed steps; ratio of medians.
   Measured only where it decides something (:func:`tax_decides`): a parameter went unused
   (the failure's fix and the pass's advice quote it) or the flag is on (the advice to turn
   it off quotes it), and always in injected mode. With every parameter used and the flag off
   (the common production case) it would decide nothing and cost about 14 of the user's
   training steps and 3 wraps: the record says it was not measured and why.
4. Remedy verified (``conformance.harness.remedies``): when the reproduction failed, the very
   same steps and data again with ``find_unused_parameters=True``; "verified fix" when every
   rank completes them *and* every parameter gets a gradient at some step (a change that only
   silences DDP's error while a block still never trains fixes nothing: "did not fix", naming
   the parameters) (the record's :data:`reports.keys.REMEDIES`). The static_graph=True
   suggestion for a graph that never changes is tried too, on the target's step with two
   microbatches (its no_sync accumulation): advice that would crash the step is withdrawn.

Target mode: failed when some parameter is unused somewhere and find_unused_parameters is
False (or static_graph is True); passed with the measured tax when it is True; passed when
every parameter is always used (with the measured tax as advice when the flag is on; the tax
not measured when it is off). Injected mode: a per-rank seeded coin flip decides the aux
head of a vehicle; passes iff discovery == injection on every (rank, step), the reproduction
fails naming exactly the aux head's parameters, and the tax was measured.

    ddp-conformance run --checks unused-parameters
    ddp-conformance run --target branchy --checks unused-parameters
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from conformance.harness.context import CheckContext
from conformance.harness.ddp import (
    SCENARIO_DATA_SEED as DATA_SEED,  # the reproduction replays the scenarios' batches
)
from conformance.harness.outcome import Outcome
from conformance.harness.parallel import not_applicable
from conformance.harness.remedies import (
    NOT_VERIFIED,
    STATIC_GRAPH_NO_SYNC_CAUSE,
    Remedy,
    Rerun,
    static_graph_no_sync,
    verify,
)
from ddp_conformance.reports.keys import FIND_UNUSED_TAX, REMEDIES, UNUSED_TABLE

from .._log import InjectionLog, record_injections
from ..injectors import ConditionalBranch
from ..scenarios import Scenario, run_scenario, scenario_deadline, scenario_world
from ..vehicles import VehicleSpec, resolve
from ._find_unused_tax import measure_tax
from ._kept_model import build_or_take, keep

if TYPE_CHECKING:
    from conformance.harness.world import RankContext, RankResult, WorldLike

    from ..scenarios import ScenarioResult

STEPS = 8  # seeded global batches per rank in discovery
# Steps of the static_graph=True re-run: the first records the graph, the later ones run on it.
STATIC_STEPS = 3
#: Evidence key of a re-run: parameters that got no gradient at any step on any rank.
NEVER_TRAINED = "never_got_gradient"
# Seed 1207: both ranks take the aux head at step 0 (DDP sees it used), then at step 1 rank 0
# takes it and rank 1 does not -- the incident's "ranks 0-1 took the branch, 2-7 did not".
INCIDENT = VehicleSpec(kind="branchy", branch=ConditionalBranch(seed=1207))
ALWAYS = VehicleSpec(kind="branchy", branch=ConditionalBranch())


def discover_rank(ctx: RankContext, source: VehicleSpec | str, steps: int, singles: int, *,
                  keep_model: bool = False) -> dict[str, Any]:
    """Names of the parameters without a gradient, per step (this rank's chunk) and sample.
    ``keep_model``: the module is left to the next call (a fresh world's only: ``_kept_model``)."""
    from conformance.harness.ddp import PROBE_SEED
    from conformance.harness.sharding import rank_batch
    from conformance.harness.sync_batchnorm import substitute

    log = InjectionLog()
    target = resolve(source, ctx.rank, log)
    model, rng_after_build = build_or_take(target, source, PROBE_SEED)
    model = model.to(ctx.device)
    # On gloo/CPU, nn.SyncBatchNorm runs as the suite's CPU stand-in (it raises on CPU), as in
    # every other check's build; every rank runs this forward, so its all-reduces pair up.
    substitute(model, ctx.device)
    names = [n for n, p in model.named_parameters() if p.requires_grad]

    def unused_after(inputs: Any, targets: Any) -> list[str]:
        model.zero_grad(set_to_none=True)
        target.compute_loss(model, inputs, targets).backward()
        return [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]

    per_step = []
    for step in range(steps):
        inputs, targets = rank_batch(target, ctx.rank, ctx.world_size, seed=DATA_SEED + step, device=ctx.device)
        per_step.append(unused_after(inputs, targets))
    # Single samples: rank r gets row r of a seeded global batch of world_size rows -- the
    # same rows the reproduction replays with per_rank=1. A branch that every 4-sample chunk
    # triggers can still be skipped by a rank whose one sample does not ask for it.
    per_sample: list[list[str] | None] = []
    for step in range(singles):
        try:
            inputs, targets = rank_batch(target, ctx.rank, ctx.world_size, seed=DATA_SEED + step, per_rank=1,
                                         device=ctx.device)
            per_sample.append(unused_after(inputs, targets))
        except Exception:  # e.g. BatchNorm refuses one sample: that probe says nothing
            per_sample.append(None)
    if keep_model:
        keep(source, model, rng_after_build)
    return {"names": names, "steps": per_step, "singles": per_sample, "injections": log.items}


def remedy_rank(ctx: RankContext, source: VehicleSpec | str, overrides: dict[str, Any], steps: int,
                per_rank: int, microbatches: int = 1) -> dict[str, Any]:
    """The reproduction's DDP loop (same model seed, same batches) with ``overrides`` on the
    target's ddp_kwargs: how many steps of its own train_step every rank completed. The module
    is the one the discovery left in this world (``_kept_model``), else built here. With
    ``microbatches`` > 1 each step gets this rank's rows in that many microbatches (the
    target's accumulation path: no_sync, where its train_step uses it)."""
    from conformance.harness.ddp import PROBE_SEED, unwrap, wrap
    from conformance.harness.sharding import batch_dims, rank_batch, shard

    target = resolve(source, ctx.rank, InjectionLog())
    # The discovery's seeded module where it left one in this world and no tax took it (the
    # static_graph re-run): a second build beside it would be two model copies on the rank.
    module, _ = build_or_take(target, source, PROBE_SEED)
    model = wrap(module, ctx.device, {**target.ddp_kwargs, **overrides}, target=target)
    optimizer = target.make_optimizer(model)
    names = {id(p): n for n, p in unwrap(model).named_parameters() if p.requires_grad}
    trained: set[str] = set()

    def at_step(opt: Any, args: Any, kwargs: Any) -> None:
        # What optimizer.step() gets: a change that only silences DDP's error leaves a
        # parameter without a gradient (or with an all-zero one) at every step.
        for group in opt.param_groups:
            for p in group["params"]:
                if id(p) in names and p.grad is not None and bool(p.grad.detach().abs().sum() > 0):
                    trained.add(names[id(p)])

    handle = optimizer.register_step_pre_hook(at_step)
    for step in range(steps):
        batch = rank_batch(target, ctx.rank, ctx.world_size, seed=DATA_SEED + step, per_rank=per_rank,
                           device=ctx.device)
        target.run_step(model, optimizer, shard(batch, 0, 1, microbatches, dims=batch_dims(target)), step=step)
    handle.remove()
    return {"steps": steps, "without_gradient": sorted(set(names.values()) - trained)}


#: How a rank reports that a peer's connection went away (gloo, torch.distributed): the peer
#: died or left a collective, not this rank's DDP error.
PEER_LOST = ("Connection closed by peer", "Connection reset by peer", "Check the logs of the remote worker",
             "failed to pass monitoredBarrier", "DistNetworkError")


def peer_lost(error: str) -> bool:
    """Is this rank's error only a lost peer connection (no error of DDP's own)?"""
    return any(mark in error for mark in PEER_LOST)


def verify_change(world: WorldLike, source: VehicleSpec | str, *, steps: int, per_rank: int,
                  deadline: float, overrides: dict[str, Any] | None = None, microbatches: int = 1) -> Remedy:
    """Re-run the failed reproduction with ``overrides`` on the target's ddp_kwargs (default
    find_unused_parameters=True; with static_graph=False too when the target set it; a wrong
    change in the test of a remedy that does not fix). Fixed: every rank completed every step."""
    from conformance.harness.world import WorldError, WorldHang

    change = overrides if overrides is not None else {"find_unused_parameters": True}

    def rerun() -> Rerun:
        try:
            done = world.run(remedy_rank, source, change, steps, per_rank, microbatches, deadline=deadline)
        except WorldError as exc:
            errors = {str(r.rank): r.error.describe().splitlines()[0][:300] for r in exc.results if r.error}
            failed = {"completed": False, "errors": errors, "steps": steps, "microbatches_per_rank": microbatches}
            if errors and all(peer_lost(text) for text in errors.values()) and not isinstance(exc, WorldHang):
                # No rank raised DDP's error and nothing hung: a peer's connection went away
                # (its process died, or its previous barrier failed). That says nothing about
                # the change either way.
                return Rerun(None, {**failed, "reason": f"the re-run with the change lost a peer connection "
                                                        f"({next(iter(errors.values()))[:160]}), which is neither "
                                                        f"DDP's error nor a hang: it proves nothing either way"})
            # The same error or hang again: the change did not remove the failure.
            return Rerun(False, failed)
        # A fix is verified when the steps complete *and* every parameter trains: a parameter
        # without a gradient at every step on every rank still never trains (the error is gone,
        # the bug is not: a siamese tower under reentrant checkpointing).
        never = sorted(set.intersection(*(set(r.value.get("without_gradient") or []) for r in done))) if done else []
        return Rerun(all(r.value["steps"] == steps for r in done) and not never,
                     {"completed": True, "steps": steps, "ranks": len(done), "samples_per_rank": per_rank,
                      "microbatches_per_rank": microbatches, NEVER_TRAINED: never})

    return verify(", ".join(f"{k}={v}" for k, v in change.items()), rerun)


#: Why the tax was not measured: every parameter was used and find_unused_parameters is off.
TAX_DECIDES_NOTHING = "its cost was not measured, nothing here depends on it"


def tax_decides(table: dict[str, Any], kwargs: dict[str, Any]) -> bool:
    """Does the find_unused_parameters tax decide a verdict or advice on a target? It does where
    a parameter went unused (the failure's or the pass's advice quotes it) or where the flag is
    on (the advice to turn it off quotes it); with every parameter used and the flag off (the
    common production case) it would decide nothing, and costs about 14 of the user's steps."""
    return bool(table) or bool(kwargs.get("find_unused_parameters", False))


def _usage(results: list[RankResult]) -> tuple[list[str], dict[str, dict[str, list[int]]], list[int], bool]:
    names = results[0].value["names"]
    unused: dict[str, dict[str, set[int]]] = {}
    observations: list[tuple[str, ...]] = []
    all_used_steps: list[int] = []
    for step in range(len(results[0].value["steps"])):
        if all(not r.value["steps"][step] for r in results):
            all_used_steps.append(step)
    for r in results:
        for step, missing in enumerate(r.value["steps"]):
            observations.append(tuple(missing))
            for n in missing:
                entry = unused.setdefault(n, {"ranks": set(), "steps": set(), "single_steps": set()})
                entry["ranks"].add(r.rank)
                entry["steps"].add(step)
        for step, missing in enumerate(r.value["singles"]):
            if missing is None:
                continue
            observations.append(tuple(missing))
            for n in missing:
                entry = unused.setdefault(n, {"ranks": set(), "steps": set(), "single_steps": set()})
                entry["ranks"].add(r.rank)
                entry.setdefault("single_steps", set()).add(step)
    table = {n: {"ranks": sorted(e["ranks"]), "steps": sorted(e["steps"]),
                 "single_sample_steps": sorted(e["single_steps"])} for n, e in sorted(unused.items())}
    static_ok = len(set(observations)) <= 1
    return names, table, all_used_steps, static_ok


def run(ctx: CheckContext) -> Outcome:
    if not ctx.injected and ctx.target.has("parallelize"):
        # FSDP2 reduces whatever gradients exist: no reducer waits on an unused parameter.
        return Outcome.skipped(not_applicable("DDP's find_unused_parameters and its reducer's "
                                              "unused-parameter error"))
    if ctx.new_world is None:
        why = "the reproduction may hang on purpose: it needs a supervised world, which --attach does not have"
        if ctx.injected:  # the suite's own vehicle: nothing of the target goes unverified
            return Outcome.skipped(why)
        # The target's model and ddp_kwargs are there: whether its branches break DDP was not tried.
        return Outcome.not_run_here(why, check="unused-parameters", target=ctx.target.spec)
    source = INCIDENT if ctx.injected else ctx.target.spec
    kwargs = dict(INCIDENT.ddp_kwargs) if ctx.injected else dict(ctx.target.ddp_kwargs)
    # One fresh world for every call, discovery included (it cannot hang: no DDP), so the
    # model its ranks build is the one the next call trains (_kept_model): the tax, or, where
    # the tax decides nothing, the static_graph re-run. Where neither runs, the world closes
    # with the check and the kept model goes with its ranks.
    with scenario_world(ctx) as world:
        # The check's own deadline: the discovery is 2 x STEPS forward/backward passes of the
        # user's model, not a scenario that may hang.
        found = world.run(discover_rank, source, STEPS, 0 if ctx.injected else STEPS, keep_model=True,
                          deadline=ctx.deadline)
        injections = [i for r in found for i in r.value["injections"]]
        record_injections(ctx, injections)
        names, table, all_used, static_ok = _usage(found)
        first = min((s for e in table.values() for s in e["steps"]), default=None)
        first_single = min((s for e in table.values() for s in e["single_sample_steps"]), default=None)
        repro, remedy, static = None, None, None
        tax_info: dict[str, Any] = {"measured": False, "reason": TAX_DECIDES_NOTHING}
        if ctx.injected or tax_decides(table, kwargs):
            # Tax on a step where every parameter is used on every rank (False cannot run
            # otherwise). The vehicle's branch follows (rank, step), not data: its tax runs with
            # the aux always on. Before the reproduction: the tax takes the discovery's model.
            tax_source, tax_seed = source, (DATA_SEED + all_used[0]) if all_used else None
            if tax_seed is None or ctx.injected:
                tax_source, tax_seed = ALWAYS, DATA_SEED
            tax_info = measure_tax(ctx, world, tax_source, tax_seed,
                                   "target" if tax_source == source else "vehicle (aux always on)")
        replay = (4, first) if first is not None else (1, first_single) if first_single is not None else None
        if replay is not None and not kwargs.get("find_unused_parameters", False):
            # Replay the first data that left a parameter without gradient, plus one step:
            # DDP reports it at the next forward (or the peer hangs in the bucket all-reduce).
            per_rank, upto = replay
            sc = Scenario("unused-reproduce", "ddp", source, None, steps=upto + 2, per_rank=per_rank)
            repro = run_scenario(ctx, world, sc, deadline=scenario_deadline(ctx))
            if repro.diagnosis.classification != "none":
                # The recommendation is tried, not only given: the same steps, the same data,
                # find_unused_parameters=True (in the same world: a hung rank was released by
                # the scenario's subgroup timeout, a dead one replaced at the next call).
                # static_graph=True cannot search for unused parameters: the remedy turns it off.
                fix = {"find_unused_parameters": True, **({"static_graph": False} if kwargs.get("static_graph")
                                                          else {})}
                # In a world of its own: the reproduction just hung or raised in this one, and
                # what it left behind (a rank released late from the subgroup, a monitored
                # barrier one rank missed on a loaded host) must not pass for the remedy's
                # failure (seen: "did not fix" on a gloo "connection closed" under load).
                with scenario_world(ctx) as clean:
                    remedy = verify_change(clean, source, steps=sc.steps, per_rank=per_rank,
                                           deadline=scenario_deadline(ctx), overrides=fix)
        if not ctx.injected and not table and static_ok and not kwargs.get("static_graph") \
                and not kwargs.get("find_unused_parameters"):
            # The static_graph=True suggestion is tried on the step as production runs it,
            # accumulation included: on torch 2.13 static_graph and no_sync do not mix
            # (pytorch/pytorch#143580), and advice that crashes the user's step is worse than none.
            static = verify_change(world, source, steps=STATIC_STEPS, per_rank=4, microbatches=2,
                                   deadline=scenario_deadline(ctx), overrides={"static_graph": True})
    metrics = {"key_figure": (f"{len(table)} unused params" if table else "all params used")
               + (f", tax x{tax_info['tax']:.2f}" if tax_info.get("tax") else ""),
               "parameters": len(names), "unused_parameters": len(table),
               FIND_UNUSED_TAX: tax_info.get("tax"), "step_s_find_unused_false": tax_info.get("false_s"),
               "step_s_find_unused_true": tax_info.get("true_s"), "static_graph_compatible": static_ok}
    evidence: dict[str, Any] = {UNUSED_TABLE: table, "tax": tax_info}
    tried = [r.to_json() for r in (remedy, static) if r is not None]
    if tried:
        evidence[REMEDIES] = tried
    if repro is not None:
        evidence["reproduction"] = {"diagnosis": repro.diagnosis.as_dict(), "describe": repro.diagnosis.describe(),
                                    "latency_s": round(repro.latency_s, 3),
                                    "errors": {str(s.rank): s.text[-1200:] for s in repro.states if s.text},
                                    "stacks": {str(k): v[-1200:] for k, v in repro.stacks.items()}}
    if ctx.injected:
        return _judge_injected(found, table, repro, tax_info, metrics, evidence)
    return _judge_target(ctx, kwargs, table, repro, tax_info, static_ok, metrics, evidence, remedy, static)


def _where(table: dict[str, dict[str, list[int]]]) -> str:
    ranks = sorted({r for e in table.values() for r in e["ranks"]})
    steps = sorted({s for e in table.values() for s in e["steps"]})
    singles = sorted({s for e in table.values() for s in e.get("single_sample_steps", [])})
    where = f"on ranks {ranks}" + (f" at steps {steps[:10]}" if steps else "")
    return where + (f" (single-sample batches {singles[:10]})" if singles and not steps else "")


def _remedy_text(remedy: Remedy | None) -> str:
    if remedy is None:
        return ""
    ev = remedy.evidence
    if remedy.verified:
        return (f"; re-run with {remedy.change}: verified fix ({ev['steps']} steps completed on every rank, "
                f"the same data)")
    if ev.get(NEVER_TRAINED):
        never = ev[NEVER_TRAINED]
        return (f"; re-run with {remedy.change}: {remedy.status} (the error is gone, but {', '.join(never[:4])}"
                f"{' and more' if len(never) > 4 else ''} got no gradient at any of its {ev['steps']} steps on "
                f"any rank: they still never train — find why they get no gradient)")
    why = "; ".join(f"rank {r}: {e}" for r, e in (ev.get("errors") or {}).items()) or ev.get("reason", "")
    return f"; re-run with {remedy.change}: {remedy.status} ({why})"


def _static_graph_advice(static: Remedy | None) -> str:
    """The static_graph suggestion, as its re-run on the target's accumulating step came out."""
    if static is None or static.status == NOT_VERIFIED:
        return "The graph never changed: static_graph=True may speed DDP up further."
    ev = static.evidence
    if static.verified:
        return (f"The graph never changed: static_graph=True may speed DDP up further (re-run with it: "
                f"{ev['steps']} steps of K={ev['microbatches_per_rank']} microbatches completed on every rank).")
    errors = "; ".join(f"rank {r}: {e}" for r, e in (ev.get("errors") or {}).items())
    head = (f"The graph never changed, but keep static_graph off: re-run with static_graph=True and "
            f"K={ev.get('microbatches_per_rank')} microbatches, this train_step raised")
    if static_graph_no_sync(errors):
        # A known limitation of torch, not a bug of the user's: torch's own text ("INTERNAL ASSERT
        # FAILED ... please report a bug to PyTorch") on a passed check would read as an alarm.
        # The raw error stays in the evidence (remedies).
        ranks = ", ".join(str(r) for r in (ev.get("errors") or {}))
        return f"{head} DDP's static_graph assertion on ranks {ranks}: {STATIC_GRAPH_NO_SYNC_CAUSE}."
    return f"{head} ({errors[:300]})."


def _judge_target(ctx: CheckContext, kwargs: dict[str, Any], table: dict[str, Any], repro: ScenarioResult | None,
                  tax: dict[str, Any],
                  static_ok: bool, metrics: dict[str, Any], evidence: dict[str, Any],
                  remedy: Remedy | None = None, static: Remedy | None = None) -> Outcome:
    name = ctx.target.name
    tax_text = f"{tax['tax']:.2f}x step time" if tax.get("tax") else None
    if tax.get("tax") and tax["tax"] < 1:
        # find_unused_parameters=True only adds work (a walk of the autograd graph): below 1x
        # is the host's noise between the timed blocks, not a saving.
        tax_text = f"no measurable time (x{tax['tax']:.2f}: within the host noise)"
    # An unmeasured tax is said as such, never spliced in as if it were a figure.
    why_unmeasured = _first_line(tax.get("error") or tax.get("reason")) or "no timing"
    unmeasured = f"its cost not measured here ({why_unmeasured})"
    at_cost = f"at a measured cost of {tax_text}" if tax_text else f"({unmeasured})"
    if tax.get("tax") and tax["tax"] < 1:
        at_cost = f"at no measurable cost (x{tax['tax']:.2f}: within the host noise)"
    params = ", ".join(table)
    if table and not kwargs.get("find_unused_parameters", False):
        seen = "not reproduced within the steps run"
        if repro is not None and repro.diagnosis.classification != "none":
            seen = repro.diagnosis.describe()
        never = (remedy.evidence.get(NEVER_TRAINED) if remedy is not None else None) or []
        return Outcome.failed(
            f"{name}: parameters {params} receive no gradient {_where(table)}, and ddp_kwargs has "
            f"find_unused_parameters=False: DDP fails -- {seen}{_remedy_text(remedy)}", metrics=metrics,
            evidence=evidence,
            recommendation=(f"Make {', '.join(never[:4])}{' and the rest' if len(never) > 4 else ''} receive a "
                            f"gradient: find_unused_parameters=True only silences DDP's error, they still never "
                            f"train (re-run with it). Look for what cuts them off the loss: a reentrant "
                            f"checkpoint of inputs that need no gradient (use_reentrant=False), a detach(), "
                            f"a branch no rank takes" if never else
                            # The fix re-run and verified leads (one sentence), the fix that saves
                            # its cost follows as the details.
                            f"Set find_unused_parameters=True in ddp_kwargs: the failing steps re-ran to "
                            f"completion with it (verified fix), {at_cost}. To save "
                            f"that cost, make every parameter participate every step instead (remove the "
                            f"data-dependent branch, e.g. multiply the aux output by 0 instead of skipping "
                            f"it) and keep find_unused_parameters=False."
                            if remedy is not None and remedy.verified else
                            f"Make every parameter participate every step (remove the data-dependent "
                           f"branch, e.g. multiply the aux output by 0 instead of skipping it) and keep "
                           f"find_unused_parameters=False; or set find_unused_parameters=True "
                           f"{at_cost}."))
    if kwargs.get("static_graph") and not static_ok:
        return Outcome.failed(f"{name}: static_graph=True but the set of used parameters changes "
                              f"between iterations ({params} {_where(table)})", metrics=metrics,
                              evidence=evidence,
                              recommendation="Remove static_graph=True or make the graph identical every step.")
    if table:
        return Outcome.passed(
            f"{name}: parameters {params} are unused {_where(table)}; find_unused_parameters=True "
            f"handles it {at_cost}", metrics=metrics, evidence=evidence,
            recommendation=f"Remove the dynamic branch so every parameter participates, then set "
                           f"find_unused_parameters=False and save " + (f"the {tax_text} tax." if tax_text else "its cost."))
    rec = None
    if kwargs.get("find_unused_parameters"):
        rec = (f"Every parameter is always used: set find_unused_parameters=False "
               f"({f'it costs {tax_text}' if tax_text else unmeasured}).")
    elif static_ok and not kwargs.get("static_graph"):
        rec = _static_graph_advice(static)
    cost = f"find_unused_parameters=True{f' would cost {tax_text}' if tax_text else ': ' + unmeasured}"
    if tax.get("measured") is False:
        # Every parameter used and the flag off (tax_decides): the tax was left unmeasured on
        # purpose, said as such -- neither a figure nor an error.
        cost = f"find_unused_parameters stays off: {tax.get('reason') or TAX_DECIDES_NOTHING}"
    return Outcome.passed(f"{name}: every parameter received a gradient on every rank and step ({cost})",
                          metrics=metrics, evidence=evidence, recommendation=rec)


def _first_line(text: Any) -> str:
    return str(text).strip().splitlines()[0][:160] if text else ""


def _judge_injected(found: list[RankResult], table: dict[str, Any], repro: ScenarioResult | None,
                    tax: dict[str, Any],
                    metrics: dict[str, Any], evidence: dict[str, Any]) -> Outcome:
    aux = set(INCIDENT.aux_parameter_names)
    problems = []
    branch = INCIDENT.branch
    fired = sum(1 for r in found for i in r.value["injections"] if i.name == branch.name)
    if not fired:
        problems.append(f"the {branch.name} fault never fired: no rank recorded taking the branch")
    elif not table:
        problems.append("the branch fired on every (rank, step), never skipped: pick another seed")
    for r in found:
        for step, missing in enumerate(r.value["steps"]):
            expected = set() if branch.fires(r.rank, step) else aux
            if set(missing) != expected:
                problems.append(f"rank {r.rank} step {step}: found unused {sorted(missing)}, "
                                f"injected {sorted(expected)}")
    if repro is None or repro.diagnosis.classification == "none":
        problems.append("find_unused_parameters=False did not fail in the reproduction")
    else:
        named = {n for names in repro.diagnosis.unused.values() for n in names}
        if named != aux:
            problems.append(f"DDP's error named {sorted(named)}, injected aux head {sorted(aux)}")
    if not tax.get("tax"):
        problems.append(f"find_unused_parameters tax not measured ({tax.get('error')})")
    if problems or repro is None:
        return Outcome.failed("unused-parameter diagnosis != injection: " + "; ".join(problems[:6]),
                              metrics=metrics, evidence=evidence)
    return Outcome.passed(
        f"seeded per-rank branch found exactly ({', '.join(sorted(aux))} {_where(table)}); "
        f"find_unused_parameters=False reproduced: {repro.diagnosis.describe()[:300]}; "
        f"find_unused_parameters=True tax x{tax['tax']:.2f}",
        metrics=metrics, evidence=evidence,
        recommendation="Remove dynamic branches so every parameter participates and keep "
                       "find_unused_parameters=False; True costs the measured tax every step.")
