"""Check ``shared-weights``: a tied or reused parameter gets its full gradient under DDP —
summed over its uses, averaged over ranks — in every DDP mode production might use.

    ddp-conformance run --checks shared-weights --target tied-lm
    ddp-conformance run --checks shared-weights --target my_target.py

Contract (docs/ddp-background.md, "How DDP synchronises"; DDP docs on shared parameters): a parameter
reached by several uses receives several gradient contributions in one backward, and DDP may
mark it ready only after the last one; with ``find_unused_parameters=True`` or
``static_graph=True`` the reducer's bookkeeping differs, so each mode is run. A use whose
contribution is cut off in the model (``weight.detach()`` in a tied output projection) is a
silent loss no gradient comparison against the same model can see, so uses are also
checked one by one.

Dropout is switched off and BatchNorm normalises each rank's shard as a group on both sides
(as in the equivalence checks; recorded as ``dropout_disabled``, ``batchnorm_grouped``).

What runs: (1) discovery, on every rank — parameters reached by several module paths
(``named_parameters(remove_duplicate=False)``) and modules called more than once per forward
(forward hooks counting calls); (2) in the 1-rank reference world (never on rank 0 alone
inside the N-rank world: a forward that calls a collective — SyncBatchNorm, a gather layer —
would wait there for the other ranks forever): each tied alias is untied into its own copy and
one forward/backward on the global batch shows which uses contribute a gradient (a use that
forward reads — perturbing it moves the loss — but whose copy gets no gradient is *lost*);
the single-process reference gradient of the global batch (plain autograd from the initial
weights, which rank 0 then starts from), written to files in the check's temp dir; (3) on every
rank of the persistent world, for the configured ``ddp_kwargs``, ``find_unused_parameters=True``
and ``static_graph=True``: 2 DDP iterations of forward/backward (``target.compute_loss``, no
optimizer step, so the reference stays valid) on each rank's shard, gradients compared with
the reference *on each rank*, against those files (tolerance as gradient-equivalence; a ratio
of ~2 or ~0 is named double-counted or lost). One unshared parameter is compared beside the
shared ones (``_control``): when every gradient is off by one factor, the loss is named as the
cause (a summed loss halves them all at 2 ranks), not the sharing; and where the shared
gradients exceed the fixed fp32 tolerance by no more than ``MARGIN`` times the control's own
relative difference (bf16 autocast's rounding reaches every parameter alike), they pass saying
so, with that bound in the evidence (``noise_floor``) — unless the bound is wide enough to pass
the smallest scaling bug, where the fixed tolerance stands (``_control_noise``). Only per-tensor summaries
reach the supervisor.

A model without shared parameters is *skipped* with evidence ``shared: []``: there is no
shared gradient to compare, and a check that compared nothing never passes.

Evidence: ``tied`` (alias groups and per-use gradient norms), ``reused_modules`` (calls per
forward), ``variants`` (per DDP mode: worst parameter, max |Δgrad|, ratio to the reference).
"""

from __future__ import annotations

import math
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ddp_conformance.reports.keys import NONFINITE, VERIFIED

from ..harness.batches import digest as batch_digest
from ..harness.context import CheckContext
from ..harness.failures import probe_timeout_outcome, world_error_outcome
from ..harness.ddp import MODEL_SEED, unwrap
from ..harness.outcome import Outcome
from ..harness.sharding import batch_dims, global_batch, shard, to_device
from ..harness.world import RankContext, RankFailure, WorldHang
from .sharing import ITERATIONS, discover, live_grad, mixing_of, reference_probe, sample_prints, start_from_reference
from .equivalence import (
    DIGEST,
    MARGIN,
    MIXING_ADVICE,
    Mixing,
    REFERENCE,
    Compared,
    compare_snapshot,
    compared_by,
    disable_dropout,
    first_divergence,
    fmt,
    group_batchnorm,
    has_snapshot,
    named_digests,
    rank_view,
    smallest_bug,
    who_sees,
)

PROBE = "the shared-weights probe"
VARIANTS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("configured", {}),
    ("find_unused_parameters=True", {"find_unused_parameters": True, "static_graph": False}),
    ("static_graph=True", {"static_graph": True}),
)


def probe(rank_ctx: RankContext, target_spec: str, batch_size: int, folder: str) -> dict[str, Any]:
    """Discovery, then every DDP variant, against the reference ``reference_probe`` wrote.

    The reference's gradients reach the ranks as files in ``folder`` (``equivalence.snapshots``);
    every rank compares its own gradients with them where they are and returns summaries
    (``equivalence.tensors.Compared``), never a tensor; a rank that cannot read them (another host under
    ``--attach``) returns digests of its gradients instead, held to rank 0's (``equivalence.digests``).
    Memory on a rank: the DDP model. Every rank runs every forward here: the model's own
    collectives pair up.
    """
    from ..harness.rank_run import RankRun

    run = RankRun.load(rank_ctx, target_spec)
    target = run.target
    device, rank, n = rank_ctx.device, rank_ctx.rank, rank_ctx.world_size
    snapshots = Path(folder) if rank == 0 else rank_view(Path(folder), rank)
    batches = [global_batch(target, batch_size, seed=MODEL_SEED + step) for step in range(ITERATIONS)]
    # Every rank draws the same global batch from the same seed, unless make_batch reads state
    # built differently in this process: then the reference's batch is not this rank's.
    out: dict[str, Any] = {"rank": rank, "batch_digests": [batch_digest(x) + batch_digest(y) for x, y in batches]}
    model = run.build(seed=MODEL_SEED)
    out.update(discover(target, model, shard(batches[0], rank, n, 1, dims=batch_dims(target))[0], device))
    shared, control = out["shared"], out["control"]
    compared = shared + control
    del model
    if not shared:
        return out
    variants: list[dict[str, Any]] = []
    referenced, sees, digest = False, True, False
    # Under parallelize the DDP variants do not exist: the target's own wrapper, once.
    parallel = target.parallelize is not None
    for label, overrides in VARIANTS[:1] if parallel else VARIANTS:
        kwargs = run.ddp_kwargs(overrides)
        if any(v["kwargs"] == repr(kwargs) for v in variants):
            continue
        # As in the equivalence checks: dropout masks cannot match between N ranks and one
        # process, and BatchNorm must normalise the same groups of samples on both sides.
        # Construction broadcasts rank 0's weights: the reference below starts from them.
        def settle(fresh: Any) -> tuple[list[str], Any]:
            settled = disable_dropout(fresh), group_batchnorm(fresh, batch_size // n)
            if rank == 0:
                start_from_reference(fresh, snapshots, device)
            return settled

        # Construction broadcasts rank 0's (the reference's) weights to every rank.
        wrapped = run.build_wrapped(seed=MODEL_SEED, ddp_overrides=overrides, before_wrap=settle)
        out["dropout_disabled"], out["batchnorm_grouped"] = wrapped.settled
        ddp = wrapped.ddp
        if not referenced:
            referenced = True
            # The reference finished writing before this world call started: absent here means
            # another host (under --attach across hosts); such a rank is judged by digest
            # against rank 0 (_digests).
            sees = has_snapshot(snapshots, "ref0")
            digest = not all(who_sees(rank_ctx, sees))
            out["compared_by"] = REFERENCE if sees else DIGEST
            out["digests"] = []
        grads = []
        for step, batch in enumerate(batches):
            ddp.zero_grad(set_to_none=True)
            x, y = to_device(shard(batch, rank, n, 1, dims=batch_dims(target)), device)[0]
            # The configured variant's first forward is held to the reference's per sample as it
            # runs: a model that mixes samples is then named, not the sharing (``sharing.mixing_of``).
            watch = step == 0 and not variants
            # A synchronising backward on every rank: each variant runs the same iterations
            # everywhere, so the reducer's all-reduces pair up.
            with sample_prints(unwrap(ddp), target, x, on=watch) as calls:
                target.compute_loss(ddp, x, y).backward()
            if watch and sees:
                out["mixing"] = mixing_of(calls, snapshots, rank * (batch_size // n))
            live = [(s, live_grad(unwrap(ddp), s)) for s in compared]
            if digest:
                out["digests"].append((f"shared gradients of iteration {step} under DDP {label}",
                                       named_digests(live)))
            grads.append(compare_snapshot(live, snapshots, f"ref{step}", device, grad=True)
                         if sees else [])
            del live
        variants.append({"label": label, "kwargs": repr(kwargs), "grads": grads})
        del ddp, wrapped
    out["variants"] = variants
    return out


def _first_nonfinite(head: dict[str, Any], values: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The first NaN/Inf gradient: the single-process reference first, then each rank's runs."""
    for iteration, name in enumerate(head.get("reference_nonfinite") or []):
        if name is not None:
            return {"name": name, "iteration": iteration, "where": "single-process reference",
                    "rank": None}
    for value in values:
        for v in value["variants"]:
            for iteration, compared in enumerate(v["grads"]):
                for c in compared:
                    if c.name in head["shared"] and c.got_present and not c.got_finite:
                        return {"name": c.name, "iteration": iteration, "rank": value["rank"],
                                "where": f"DDP run ({v['label']}) on rank {value['rank']}"}
    return None




def _classify(c: Compared) -> str:
    if not c.got_present:
        return "lost (no gradient)"
    if not c.got_finite or not c.ref_finite:
        return "non-finite (NaN/Inf)"
    ref_norm = math.sqrt(c.ref_sq) if c.ref_present else 0.0
    if ref_norm == 0.0:
        return "unexpected gradient"
    ratio = math.sqrt(c.got_sq) / ref_norm
    if ratio < 0.05:
        return "lost"
    if ratio > 1.05:
        return f"over-counted ({ratio:.2f}x the reference)"
    return f"wrong (norm ratio {ratio:.2f})"


def _common_scale(head: dict[str, Any], values: list[dict[str, Any]], label: str) -> tuple[float, str] | None:
    """(factor, cause) when under DDP ``label`` every compared gradient -- the shared ones and
    the unshared control -- is the reference's times one factor: the loss or the data scales
    every gradient, and the sharing is not to blame. None otherwise, or without a control."""
    from .equivalence.hypotheses import scale_causes, scale_from

    if not head.get("control"):
        return None
    index = next(i for i, v in enumerate(head["variants"]) if v["label"] == label)
    per_rank = [[c for step in value["variants"][index]["grads"] for c in step]
                for value in values if value.get("compared_by") != DIGEST]
    if not any(c.name in head["control"] and c.ref_present and c.got_present for rank in per_rank for c in rank):
        return None
    factor = scale_from(per_rank, [math.sqrt(c.ref_sq) for rank in per_rank for c in rank]).uniform
    if factor is None or abs(factor - 1) < 0.05:
        return None
    causes = scale_causes(factor, world_size=len(values), microbatches=1)
    return factor, (causes[0] if causes else
                    "a factor no known bug makes; gradient-equivalence compares every parameter")


def _scaled_everywhere(head: dict[str, Any], values: list[dict[str, Any]], bad: dict[str, Any],
                       metrics: dict[str, Any], evidence: dict[str, Any]) -> Outcome | None:
    """The failure when the worst shared gradient's variant scales every gradient alike
    (``_common_scale``): named by the factor's cause, not the sharing. None otherwise."""
    common = _common_scale(head, values, bad["variant"])
    if common is None:
        return None
    factor, cause = common
    evidence["common_scale"] = {"factor": factor, "control": head["control"], "variant": bad["variant"]}
    metrics["key_figure"] = f"every gradient x{factor:.3g}, shared or not"
    return Outcome.failed(
        f"every gradient is {factor:.3g}x the single-process one under DDP {bad['variant']}, shared or "
        f"not (shared {bad['param']!r} and unshared {head['control'][0]!r} alike): not the sharing — "
        f"{cause}", metrics=metrics, evidence=evidence,
        recommendation="the loss must be a mean over the local samples (DDP averages gradients over "
                       "ranks: do not multiply or divide it by the world size); gradient-equivalence "
                       "compares every parameter")


def _control_noise(head: dict[str, Any], values: list[dict[str, Any]], label: str) -> dict[str, Any] | None:
    """What DDP in variant ``label`` and this configuration's rounding do to the unshared
    control: its largest difference relative to its own scale (``max|Δ| / max|ref|``) over steps
    and ranks, and the bound it sets for the shared gradients (``MARGIN`` times it, the margin
    the equivalence checks' measured floor uses). None without a control compared on both sides.

    Why the control is the yardstick: a sharing bug changes the shared parameters' gradients
    only, while rounding (bf16 autocast rounds every matmul to 8 mantissa bits) and the
    summation order DDP adds reach every parameter alike. Seen on build-nanogpt's bf16 step: its
    tied embedding differed by 9.2e-05 (norm ratio 1.00), over the fixed fp32 tolerance, where
    gradient-equivalence's measured floor passed every parameter."""
    index = next(i for i, v in enumerate(head["variants"]) if v["label"] == label)
    rels = [c.diff.max_rel for value in values if value.get("compared_by") != DIGEST
            for step in value["variants"][index]["grads"] for c in step
            if c.name in head.get("control", []) and c.got_present and c.ref_present
            and c.got_finite and c.ref_finite and c.diff.ref_max > 0]
    if not rels or not all(math.isfinite(r) for r in rels):
        return None
    bound = MARGIN * max(rels)
    least, _ = smallest_bug(world_size=len(values), microbatches=1)
    if bound >= least:
        # A bound that would also pass a loss scaled by N (or the control itself off by a
        # factor, which _common_scale names first) is no noise floor: the fixed tolerance stands.
        return None
    return {"control": head["control"][0], "variant": label, "control_max_rel": max(rels),
            "margin": MARGIN, "bound_rel": bound}


def _within_control_noise(head: dict[str, Any], values: list[dict[str, Any]],
                          failures: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
    """The control's noise (``_control_noise``) for every failing variant, when each of its
    shared gradients, at every step and on every rank, differs by no more than that bound
    relative to its own scale; None when any does not (a sharing bug stands out of the noise)."""
    noise = []
    for row in failures:
        measured = _control_noise(head, values, row["variant"])
        if measured is None or measured["bound_rel"] <= 0:
            return None
        index = next(i for i, v in enumerate(head["variants"]) if v["label"] == row["variant"])
        shared = [c for value in values if value.get("compared_by") != DIGEST
                  for step in value["variants"][index]["grads"] for c in step if c.name in head["shared"]]
        # `not <=`: a NaN difference is never within anything.
        if not shared or any(not c.diff.max_rel <= measured["bound_rel"] for c in shared):
            return None
        noise.append({**measured, "shared_max_rel": max(c.diff.max_rel for c in shared)})
    return noise


def _worst_rows(head: dict[str, Any], values: list[dict[str, Any]]) -> list[dict[str, Any] | None]:
    """Per DDP variant, the worst compared gradient over steps, shared parameters and ranks
    (ranks judged by digest are held to rank 0 separately)."""
    rows = []
    for index, variant in enumerate(head["variants"]):
        worst_ratio, worst_row = -1.0, None
        for step in range(len(variant["grads"])):
            for position in range(len(variant["grads"][step])):
                for value in values:
                    if value.get("compared_by") == DIGEST:
                        continue  # held to rank 0 by digest above
                    c = value["variants"][index]["grads"][step][position]
                    if c.name not in head["shared"]:
                        continue  # the control (_control): read by _common_scale
                    d, name = c.diff, c.name
                    # `not <=` also takes a NaN ratio: a non-finite gradient is never the best row.
                    if not math.isnan(worst_ratio) and not d.ratio <= worst_ratio:
                        worst_ratio = d.ratio
                        worst_row = {"variant": variant["label"], "ddp_kwargs": variant["kwargs"],
                                     "param": name, "rank": value["rank"], "iteration": step,
                                     "max_abs_grad_diff": d.max_abs, "ratio_to_tolerance": d.ratio,
                                     "ok": d.ok, "diagnosis": "" if d.ok else _classify(c),
                                     **({"worst_element": d.to_json()["worst_element"]}
                                        if d.worst_element else {})}
        rows.append(worst_row)
    return rows


def _passed(head: dict[str, Any], values: list[dict[str, Any]], rows: list[dict[str, Any] | None],
            noise: list[dict[str, Any]] | None, metrics: dict[str, Any], evidence: dict[str, Any]) -> Outcome:
    """Every shared gradient matched in every DDP mode, within the fixed tolerance or within the
    control's noise (``noise``: the bounds that widened it, said in the message)."""
    # What the pass rests on (the ready rule, reports/verdict.py).
    evidence[VERIFIED] = {"ranks": len(values), "shared_parameters": len(head["shared"])}
    metrics["key_figure"] = (f"{len(head['shared'])} shared, {len(rows)} DDP modes, max |Δgrad| "
                             f"{fmt(metrics['max_abs_grad_diff'])}")
    within = ""
    if noise:
        # Over the fixed tolerance, within what DDP does to an unshared parameter here: the
        # configuration's rounding, not the sharing (_control_noise says why).
        evidence["noise_floor"] = noise
        worst = max(noise, key=lambda n: n["shared_max_rel"])
        within = (f"; over the fixed fp32 tolerance under {', '.join(n['variant'] for n in noise)}, but within "
                  f"{worst['margin']:g}x the difference DDP makes to the unshared {worst['control']!r} "
                  f"(shared {fmt(worst['shared_max_rel'])} vs {fmt(worst['control_max_rel'])} of each "
                  f"tensor's scale): this configuration's rounding, not the sharing")
    return Outcome.passed(
        f"{len(head['shared'])} shared parameter(s) ({', '.join(head['shared'])}) get the full "
        f"gradient under {', '.join(r['variant'] for r in rows if r)}{within}",
        metrics=metrics, evidence=evidence)


def _mixes_samples(values: list[dict[str, Any]], bad: dict[str, Any], metrics: dict[str, Any],
                   evidence: dict[str, Any]) -> Outcome | None:
    """Inconclusive where the model mixes samples (``sharing.mixing_of``, measured on a rank's
    first forward against the reference's): every gradient differs from the single-process one
    by design, the shared ones with the rest — not the sharing. None where no rank saw it."""
    mixed = next((v["mixing"] for v in values if v.get("mixing")), None)
    if mixed is None:
        return None
    found, world_size = Mixing.from_json(mixed), len(values)
    evidence["mixing"] = found.to_json()
    metrics["key_figure"] = f"module {found.module!r} mixes samples"
    return Outcome.inconclusive(
        f"shared-weights cannot be judged: {found.cause(world_size=world_size)} — every gradient "
        f"differs by it, shared or not, not by the sharing; measured: shared parameter "
        f"{bad['param']!r} {bad['diagnosis']} under DDP {bad['variant']} (rank {bad['rank']}, "
        f"|Δ| {fmt(bad['max_abs_grad_diff'])})", metrics=metrics, evidence=evidence,
        recommendation=MIXING_ADVICE)


def run(ctx: CheckContext) -> Outcome:
    batch_size = ctx.target.batch_size_for(ctx.world_size, 1)
    folder = Path(tempfile.mkdtemp(prefix="shared-reference-", dir=ctx.tmpdir))
    try:
        # The reference first, in the 1-rank world; then the N ranks, each running every forward.
        ref = ctx.world(world_size=1).run(reference_probe, ctx.target.spec, batch_size, ctx.world_size,
                                          str(folder), deadline=ctx.deadline)[0].value
        values = [r.value for r in ctx.world().run(probe, ctx.target.spec, batch_size, str(folder),
                                                   deadline=ctx.deadline)] if ref["shared"] else [ref]
    except (RankFailure, WorldHang) as exc:
        # The probe's own timeout is the suite's failure, not a finding about shared weights.
        return probe_timeout_outcome(exc, PROBE) or world_error_outcome(exc, PROBE)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    head: dict[str, Any] = {**values[0], **{k: ref[k] for k in ("per_use", "reference_nonfinite") if k in ref}}
    tied = head.get("per_use", [{"names": g} for g in head["groups"]])
    evidence: dict[str, Any] = {"shared": head["shared"], "tied": tied, "reused_modules": head["reused"],
                                "dropout_disabled": head.get("dropout_disabled", []),
                                "batchnorm_grouped": head.get("batchnorm_grouped", [])}
    if not head["shared"]:
        # The subject is absent: nothing was compared, so nothing may be claimed as passed.
        return Outcome.skipped(
            "no shared parameters: no tied aliases and no module called twice per forward, so "
            "there is no shared gradient to check",
            metrics={"key_figure": "no shared parameters", "shared_parameters": 0}, evidence=evidence)
    other_data = next((v["rank"] for v in values if v.get("batch_digests") != head.get("batch_digests")), None)
    if other_data is not None:
        # Before comparing: rank 0's reference is of another batch than this rank's, so every
        # difference below would be the data's, not the sharing's.
        evidence["ranks_with_other_data"] = [v["rank"] for v in values
                                             if v.get("batch_digests") != head.get("batch_digests")]
        return Outcome.failed(
            f"rank {other_data}'s data differs from rank 0's: make_batch drew a different global batch "
            f"on rank {other_data} from the same seed, so no shared gradient can be compared with the "
            f"reference — make_batch must draw only from its generator (state built differently per "
            f"process, e.g. Python's random or a dataset split without a seeded generator, differs)",
            metrics={"key_figure": f"rank {other_data}'s data differs", "shared": head["shared"],
                     "shared_parameters": len(head["shared"])}, evidence=evidence,
            recommendation="draw the batch in make_batch only from the generator it is given, and build "
                           "any dataset it reads identically on every rank")
    bad = _first_nonfinite(head, values)
    if bad is not None:
        # Before anything else: a NaN gradient makes every later comparison (and the per-use
        # perturbation test, where NaN != NaN) meaningless.
        evidence[NONFINITE] = bad
        return Outcome.failed(
            f"non-finite gradient (NaN/Inf) of shared parameter {bad['name']!r} at iteration "
            f"{bad['iteration']} in the {bad['where']}: nothing about its sharing can be verified",
            metrics={"key_figure": f"NaN/Inf gradient of {bad['name']}", "shared": head["shared"],
                     "shared_parameters": len(head["shared"])}, evidence=evidence,
            recommendation="find where the loss or the gradient first becomes non-finite (learning "
                           "rate, a log or division of zero, fp16 overflow)")
    evidence.update(compared_by(values))
    divergence = first_divergence(values)
    if divergence is not None:
        # Ranks that disagree with each other: rank 0's comparison speaks for rank 0 alone.
        evidence["rank_divergence"] = divergence.to_json()
        return Outcome.failed(
            f"shared-parameter gradients are not the same on every rank: {divergence.message()}",
            metrics={"key_figure": f"rank {divergence.rank} diverged from rank {divergence.anchor}",
                     "shared": head["shared"], "shared_parameters": len(head["shared"])},
            evidence=evidence,
            recommendation="every use of a shared parameter must be in the autograd graph on every "
                           "rank, so that DDP all-reduces the same buckets everywhere")
    lost = [name for group in tied for name in group.get("lost_uses", [])]
    rows = _worst_rows(head, values)
    failures = [row for row in rows if row is not None and not row["ok"]]
    evidence["variants"] = rows
    metrics: dict[str, Any] = {
        "shared_parameters": len(head["shared"]), "shared": head["shared"],
        "lost_uses": lost, "variants_checked": [r["variant"] for r in rows if r],
        "max_abs_grad_diff": max((r["max_abs_grad_diff"] for r in rows if r), default=0.0),
    }
    if lost:
        owners = ", ".join(repr(n) for n in lost)
        metrics["key_figure"] = f"gradient lost from {len(lost)} use(s): {lost[0]}"
        return Outcome.failed(
            f"shared parameter use {owners} runs in forward but contributes no gradient (e.g. "
            f"weight.detach() in a tied projection): the tied weight trains on part of its uses only",
            metrics=metrics, evidence=evidence,
            recommendation="use the tied Parameter itself in every use (no .detach(), no .data, "
                           "no copies): autograd then sums every use's gradient and DDP all-reduces "
                           "the sum once")
    if failures:
        # A factor every gradient shares is a finding before it is noise (the control is then
        # no yardstick of rounding either); after it, a model that mixes samples (every gradient).
        if (found := _scaled_everywhere(head, values, failures[0], metrics, evidence)
                or _mixes_samples(values, failures[0], metrics, evidence)) is not None:
            return found
    noise = _within_control_noise(head, values, failures) if failures else None
    if failures and noise is None:
        bad = failures[0]
        metrics["key_figure"] = f"{bad['param']} {bad['diagnosis']} under {bad['variant']}"
        return Outcome.failed(
            f"shared parameter {bad['param']!r} gets a gradient {bad['diagnosis']} under DDP "
            f"{bad['variant']} (rank {bad['rank']}, |Δ| {fmt(bad['max_abs_grad_diff'])})",
            metrics=metrics, evidence=evidence,
            recommendation="avoid combining shared parameters with find_unused_parameters/static_graph "
                           "modes that disagree; every use must be part of the autograd graph")
    return _passed(head, values, rows, noise, metrics, evidence)
