"""Comparing a killed-and-restarted run with the uninterrupted one, step by step, per rank.

Alignment: the restart is expected to end where the uninterrupted run ended, so its R steps
are steps N - R + 1 .. N of the uninterrupted run (s = N - R steps were restored). The first
resumed step's *entry* state (parameters, optimizer state, learning rates, GradScaler) is what
the loop restored, compared with the uninterrupted run's entry to step s + 1; then every step's
samples and the state where ``optimizer.step()`` returned. The first difference on a rank is
its finding: everything after it follows from it.

Numerics: equal digests are bit identity; otherwise the parameters' values (when journaled)
are judged with the equivalence checks' fixed tolerance (``_compare``). A restart on CPU/gloo
is bit-identical in every correct run measured; more than 2 ranks or a GPU may add last-bit
noise in DDP's bucketed all-reduce, which the tolerance absorbs.
"""

from __future__ import annotations

import re

from collections import Counter
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from .records import KILLED_DURING_SAVE, Life, LoadRecord, Snapshot, StepRecord, values_path
from .scenarios import Run

#: Relative difference in an optimizer state's sum |x| (per key) or a learning rate within which
#: it counts as equal when the bits differ: the fp32 parameter rtol of ``_compare``.
STATE_RTOL = 1e-4


@dataclass(frozen=True, slots=True)
class Finding:
    """The first difference on one rank, with its measured cause (None: no known cause)."""

    what: str  # "raised" | "steps" | "parameters" | "optimizer" | "lr" | "scaler" | "samples"
    rank: int
    step: int | None  # the uninterrupted run's step number (1-based)
    message: str
    cause: str | None = None
    recommendation: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"what": self.what, "rank": self.rank, "step": self.step, "message": self.message,
                "cause": self.cause}


@dataclass(frozen=True, slots=True)
class Verdict:
    """One killed scenario judged against the uninterrupted run."""

    scenario: str
    kill: str  # where the kill was, in words
    resumed_at: dict[int, int]  # per rank: the uninterrupted step number of the first resumed step
    steps_compared: int  # resumed steps compared, over all ranks
    findings: list[Finding]
    warnings: list[str] = field(default_factory=list)
    samples: dict[int, dict[str, int]] = field(default_factory=dict)  # per rank: trained, repeated, missed
    trajectory: dict[str, Any] = field(default_factory=dict)  # rank 0's parameter norms (the chart)

    def as_dict(self) -> dict[str, Any]:
        return {"kill": self.kill, "resumed_at": {str(r): s for r, s in self.resumed_at.items()},
                "steps_compared": self.steps_compared, "findings": [f.as_dict() for f in self.findings],
                "warnings": self.warnings, "samples": {str(r): v for r, v in self.samples.items()}}


class Values:
    """Parameter values journaled by a life (``Journal.values``), read back on demand."""

    def __init__(self, folder: Path, scenario: str, life_no: int, life: Life) -> None:
        self.path = values_path(folder, scenario, life_no, life.rank)
        self.layout = life.layout

    def read(self, offset: int | None) -> dict[str, Any] | None:
        import torch

        if offset is None or not self.layout or not self.path.exists():
            return None
        out = {}
        with open(self.path, "rb") as f:
            f.seek(offset)
            for name, dtype, shape in self.layout:
                kind = getattr(torch, dtype)
                count = 1
                for n in shape:
                    count *= n
                raw = f.read(count * torch.empty((), dtype=kind).element_size())
                out[name] = torch.frombuffer(bytearray(raw), dtype=kind).reshape(shape) if count else \
                    torch.empty(shape, dtype=kind)
        return out


def params_differ(got: Snapshot, ref: Snapshot, got_values: Values, ref_values: Values,
                  ref_offset: int | None) -> tuple[str, float] | None:
    """(first differing parameter, its max relative difference) or None when equal (bit for
    bit, or within the fp32/dtype tolerance when both sides' values were journaled)."""
    from ..equivalence import diff_tensor

    names = [n for n in ref.params if got.params.get(n) != ref.params[n]]
    if not names:
        return None
    if set(got.params) != set(ref.params):
        return (next(iter(set(ref.params) ^ set(got.params))), float("nan"))
    mine, theirs = got_values.read(got.values), ref_values.read(ref_offset)
    if mine is None or theirs is None:
        return (names[0], float("nan"))
    for name in names:
        diff = diff_tensor(name, mine[name], theirs[name], grad=False)
        if not diff.ok:
            return (name, diff.max_rel)
    return None


def optimizer_differs(got: Snapshot, ref: Snapshot) -> str | None:
    """The first optimizer state key that differs (present on one side only, other tensor
    count, or a sum |x| off by more than STATE_RTOL when the bits differ), else None."""
    for key in sorted(set(got.optimizer) | set(ref.optimizer)):
        if key not in got.optimizer or key not in ref.optimizer:
            return key
        (n1, d1, s1), (n2, d2, s2) = got.optimizer[key], ref.optimizer[key]
        if n1 != n2 or (d1 != d2 and abs(s1 - s2) > STATE_RTOL * max(abs(s2), 1e-12)):
            return key
    return None


def _close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= STATE_RTOL * max(abs(y), 1e-30) for x, y in zip(a, b))


def _optimizer_text(got: Snapshot, ref: Snapshot) -> str:
    keys = ", ".join(f"{k} of {ref.optimizer[k][0]} tensors" for k in sorted(ref.optimizer))
    return keys or "no state"


def _module_load_cause(loads: list[LoadRecord]) -> str | None:
    modules = [load for load in loads if load.what == "module"]
    for load in modules:
        prefixed = load.unexpected and all(k.startswith("module.") for k in load.unexpected)
        if load.strict is False and load.keys and load.missing_count == load.keys and prefixed:
            return (f"a load_state_dict(strict=False) on the {load.owner} matched no key: the checkpoint's "
                    f"{load.unexpected_count} keys carry DDP's 'module.' prefix ({load.unexpected[0]!r}), the "
                    f"model's {load.keys} do not")
    for load in modules:
        if load.strict is False and load.missing_count:
            return (f"a load_state_dict(strict=False) on the {load.owner} left {load.missing_count} of its "
                    f"{load.keys} keys missing ({', '.join(load.missing[:3])})")
    if not modules:
        return "no load_state_dict was called on a model at the restart"
    return None


def _diverged(steps: list[StepRecord], first: Life, s: int) -> int | None:
    """The step (1-based, at most s) from which the killed life's parameters differ from the
    uninterrupted run's (digests, at a step's entry or return), None when it followed it. Only
    a killed life of its own world can (the real SIGKILL path; a copy is the uninterrupted run):
    an unseeded model, or nondeterminism between two starts."""
    return next((i + 1 for i, (mine, ref) in enumerate(zip(first.steps[:s], steps))
                 if mine.before.params != ref.before.params or mine.after.params != ref.after.params), None)


def _entry_finding(rank: int, s: int, got: Snapshot, ref: Snapshot, differs: str | None, whose: str,
                   restart: Life, initial: Snapshot) -> Finding | None:
    """The restored state at the first resumed step (``got``) against ``ref`` (``whose`` state it
    is, in words); ``differs``: the first differing parameter, measured by the caller."""
    if differs is not None:
        cause = _module_load_cause(restart.loads)
        if got.params == initial.params and s:
            cause = (cause + "; " if cause else "") + "the model started from its initial weights"
        return Finding("parameters", rank, s + 1,
                       f"parameters at the first resumed step (step {s + 1}) differ from those {whose} (first: "
                       f"{differs!r}): the weights were not restored",
                       cause, "save model.module.state_dict() (not the DDP wrapper's: its keys carry 'module.') and "
                              "load it with strict=True, so a key that does not match raises instead of loading nothing")
    if (key := optimizer_differs(got, ref)) is not None:
        reset = not any(v[0] for v in got.optimizer.values())
        loaded = any(load.what == "optimizer" for load in restart.loads)
        cause = (f"optimizer state ({_optimizer_text(got, ref)}) was reset at the restart"
                 + ("" if loaded else ": no Optimizer.load_state_dict call") if reset else None)
        return Finding("optimizer", rank, s + 1,
                       f"optimizer state at the first resumed step (step {s + 1}) differs from the one {whose} (first "
                       f"key: {key!r})", cause, "save optimizer.state_dict() in the checkpoint and load it at the restart")
    return None


def _first_finding(rank: int, s: int, a: Life, first: Life, restart: Life, va: Values, vr: Values,
                   warnings: list[str]) -> tuple[Finding | None, int]:
    """The first difference of the restart from step s + 1 on (and the steps compared)."""
    steps, resumed = a.steps, restart.steps
    ref_before = steps[s].before
    ref_offset = steps[s - 1].after.values if s else steps[0].before.values
    got = resumed[0].before
    diff = params_differ(got, ref_before, vr, va, ref_offset)
    if (diff is not None or optimizer_differs(got, ref_before)) and (k := _diverged(steps, first, s)) is not None:
        # The killed life was another run: the restart is judged against what that life saved.
        saved = first.steps[s - 1].after
        why = (" (its initial weights differ between two starts: seed torch's RNG, torch.manual_seed, before "
               "building the model, so that two starts of the job train alike)"
               if k == 1 and first.steps[0].before.params != steps[0].before.params else "")
        whose = (f"the killed life had at step {s} (a start of its own, which trained other parameters than the "
                 f"uninterrupted run from step {k}{why})")
        differs = next((n for n in saved.params if got.params.get(n) != saved.params[n]), None)
        if (found := _entry_finding(rank, s, got, saved, differs, whose, restart, first.steps[0].before)) is not None:
            return found, 0
        warnings.append(f"rank {rank}: the restart restored exactly the state {whose}, but no resumed step can be "
                        f"compared with the uninterrupted run")
        return None, 0
    found = _entry_finding(rank, s, got, ref_before, None if diff is None else diff[0],
                           "the uninterrupted run had there", restart, steps[0].before)
    if found is not None:
        return found, 0
    for j, step in enumerate(resumed):
        ref = steps[s + j]
        if not _close(step.before.lrs, ref.before.lrs):
            return _lr_finding(rank, s + j + 1, step, ref, steps[j], restart), j
        if step.before.scalers != ref.before.scalers:
            return _scaler_finding(rank, s + j + 1, step, ref, steps[0], restart), j
        if step.samples != ref.samples:
            if step.indices and step.indices == ref.indices:
                warnings.append(_augmented_warning(rank, s + j + 1, step))
                return None, j
            return _samples_finding(rank, s + j + 1, step, steps), j
        if (diff := params_differ(step.after, ref.after, vr, va, ref.after.values)) is not None:
            if (step.dropout or step.drew or ref.drew) and step.rng != ref.rng:
                warnings.append(_random_stream_warning(rank, s + j + 1, step))
                return None, j
            return Finding("parameters", rank, s + j + 1,
                           f"parameters after step {s + j + 1} differ (first: {diff[0]!r}, max relative "
                           f"difference {diff[1]:.3g}) although the step started from the same state and samples",
                           None, "compare what the restart restores with what the step depends on"), j + 1
        if (key := optimizer_differs(step.after, ref.after)) is not None:
            return Finding("optimizer", rank, s + j + 1,
                           f"optimizer state after step {s + j + 1} differs (key {key!r}) although the step started "
                           f"from the same state", None, "compare what the restart restores with what the step "
                                                          "depends on"), j + 1
    return None, len(resumed)


def _random_stream_warning(rank: int, number: int, step: StepRecord) -> str:
    """The step started from the same state and samples but from another random state, and it
    draws random numbers (measured: dropout active, or torch's RNG moved during the step)."""
    how = ("dropout is active" if step.dropout else
           "the step draws random numbers: torch's RNG moved between its first training forward and "
           "optimizer.step(), randomness other than dropout (stochastic depth, random masking, noise) that the "
           "suite does not switch off")
    return (f"rank {rank}: torch's random stream differs after the restart from step {number} (its RNG state was "
            f"not restored, and {how}): the resumed run is equally valid but not comparable step by step from "
            f"there; save torch.get_rng_state() for a bit-exact resume")


def _lr_finding(rank: int, number: int, step: StepRecord, ref: StepRecord, counted: StepRecord,
                restart: Life) -> Finding:
    """``counted``: the uninterrupted run's step whose number is this step's within the
    restart — its learning rate is what a schedule counted from the restart gives."""
    got, want = step.before.lrs, ref.before.lrs
    i = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), 0)
    cause = None
    if _close(got, counted.before.lrs):
        loaded = any(load.what == "scheduler" for load in restart.loads)
        cause = (f"the scheduler's state was not restored: its schedule started over (the learning rate at "
                 f"step {number} is the one of step {counted.index})"
                 + ("" if loaded else "; no LRScheduler.load_state_dict call at the restart"))
    shown = (f"{got[i]:g} resumed vs {want[i]:g} uninterrupted" if got and want and i < min(len(got), len(want))
             else f"{got} resumed vs {want} uninterrupted")
    return Finding("lr", rank, number, f"learning rate at step {number}: {shown}", cause,
                   "save scheduler.state_dict() in the checkpoint and load it at the restart")


def _scaler_finding(rank: int, number: int, step: StepRecord, ref: StepRecord, first: StepRecord,
                    restart: Life) -> Finding:
    got, want = step.before.scalers, ref.before.scalers
    text = ", ".join(f"scale {g[0]:g} vs {w[0]:g}, growth tracker {g[1]} vs {w[1]}" for g, w in zip(got, want)) \
        or f"{got} vs {want}"
    cause = None
    if got == first.before.scalers and got:
        loaded = any(load.what == "scaler" for load in restart.loads)
        cause = (f"the GradScaler was reset to its initial state (scale {got[0][0]:g}, growth tracker "
                 f"{got[0][1]})" + ("" if loaded else ": no GradScaler.load_state_dict call at the restart"))
    return Finding("scaler", rank, number, f"GradScaler at step {number} (resumed vs uninterrupted): {text}", cause,
                   "save scaler.state_dict() in the checkpoint and load it at the restart")


def _augmented_warning(rank: int, number: int, step: StepRecord) -> str:
    return (f"rank {rank}: step {number} drew the same {len(step.indices)} dataset indices after the restart as the "
            f"uninterrupted run, but the model got other content for them: the data pipeline is random "
            f"(augmentation) and its random state was not restored (torch's RNG, from which the DataLoader's worker "
            f"seeds are drawn too); the resumed run is equally valid but not comparable step by step from there; "
            f"save torch.get_rng_state() for a bit-exact resume")


def _samples_finding(rank: int, number: int, step: StepRecord, steps: list[StepRecord]) -> Finding:
    earlier = steps[: number - 1]
    again = next((i for i, ref in enumerate(earlier) if ref.samples == step.samples), None)
    drew = "trained the samples"
    if again is None and step.indices:  # other content (augmentation): who the samples are, by index
        again = next((i for i, ref in enumerate(earlier) if ref.indices == step.indices), None)
        drew = "drew the dataset indices"
    cause = None
    if again is not None:
        where = "the epoch's beginning" if again == 0 else f"step {again + 1}'s samples"
        cause = (f"the data order restarted at {where}: resumed step {number} {drew} of "
                 f"step {again + 1} again")
    return Finding("samples", rank, number,
                   f"rank {rank} trained other samples at step {number} than the uninterrupted run", cause,
                   "save the epoch and the position in it (batches done), and on resume call "
                   "sampler.set_epoch(epoch) and skip the batches already trained")


def sample_counts(a: Life, first: Life, restart: Life, s: int) -> dict[str, int]:
    """The multiset over the whole run: what the uninterrupted run trained, against the first
    life's steps up to the restored point plus the restart's. By content; by dataset index
    instead when the content differs but every step has its indices (a random augmentation
    makes each sample's content new at every draw)."""
    def counts(key: str) -> dict[str, int]:
        want = Counter(x for step in a.steps for x in getattr(step, key))
        got = Counter(x for step in first.steps[:s] + restart.steps for x in getattr(step, key))
        return {"trained": sum(want.values()), "repeated": sum((got - want).values()),
                "missed": sum((want - got).values())}

    by_content = counts("samples")
    if (by_content["repeated"] or by_content["missed"]) and all(
            step.indices for step in a.steps + first.steps[:s] + restart.steps):
        return {**counts("indices"), "by_index": 1}
    return by_content


def _torn_cause(run: Run, restart: Life) -> str | None:
    """The restart's torch.load failed on the very file the killed rank was writing."""
    if run.scenario != KILLED_DURING_SAVE:
        return None
    torn = [s.path for life in run.first for s in life.saves if s.inside and not s.ended
            and life.rank == run.plan.rank and s.step == run.plan.step]
    for load in restart.loads:
        if load.what == "torch.load" and load.error and torn and load.owner.endswith(torn[-1]):
            how = "stopped half-way through the save (what a kill leaves)" if run.copied else "killed during the save"
            return (f"the restart could not read the checkpoint written when rank {run.plan.rank} was {how} "
                    f"({load.error.splitlines()[0][:160]}): {torn[-1]} was {_written(run, torn[-1])}")
    return None


def _written(run: Run, path: str) -> str:
    """How the torn file was written: over a whole one of an earlier save, or as a new file
    (a name per save: the restart took the newest), in both cases under its final name."""
    earlier = [s.step for life in run.first for s in life.saves if s.path == path and s.ended and s.step < run.plan.step]
    writers = sorted({life.rank for life in run.first for s in life.saves if s.path == path and s.step == run.plan.step})
    by = f", by ranks {', '.join(map(str, writers))} alike" if len(writers) > 1 else ""
    if earlier:
        return f"written in place, over the checkpoint of step {max(earlier)}{by}"
    return f"written directly under its final name (a new file, not a temporary one renamed into place){by}"


def _refused_cause(restart: Life) -> str | None:
    """The restart's torch.load refused a whole checkpoint under ``weights_only`` (torch's default
    since 2.6): it holds a pickled object other than tensors and plain containers."""
    for load in restart.loads:
        if load.what == "torch.load" and load.error and "Weights only load failed" in load.error:
            refused = re.search(r"\[refused global: ([\w.]+)\]", load.error)
            what = (f"a pickled {refused.group(1)}" if refused
                    else "a pickled object other than tensors and plain values")
            where = f" (not tensors or plain values: {', '.join(load.refused_at)})" if load.refused_at else ""
            return (f"torch.load refused the checkpoint {load.owner} under weights_only=True (the default since torch "
                    f"2.6): it holds {what}{where}; the file itself is whole")
    return None


def _restored_point(run: Run, first: Life) -> int:
    """The latest step a checkpoint the restart could use was complete at (0: none was)."""
    if run.plan.kind == "after-step":
        saved = [s.step for s in first.saves if s.inside and s.ended and s.step < run.plan.step]
        return max(saved, default=run.plan.step - 1)
    saved = [s.step for s in first.saves if s.inside and s.ended and s.step < run.plan.step]
    return max(saved, default=0)


def _steps_finding(rank: int, n: int, s: int, run: Run, first: Life, restart: Life) -> Finding | None:
    trained = len(first.steps)
    if not restart.steps:
        return Finding("steps", rank, None, f"the restart took no optimizer step on rank {rank} ({n} in all "
                       f"were asked, {trained} trained before the kill)", None,
                       "resume the step count from the checkpoint and train until ctx.steps")
    if s < 0:
        return Finding("steps", rank, None, f"the restart ran {len(restart.steps)} optimizer steps on rank "
                       f"{rank}, more than the {n} of the whole uninterrupted run: steps were repeated", None,
                       "save the step count in the checkpoint and resume it")
    if s > trained:
        return Finding("steps", rank, s, f"the restart began at step {s + 1} on rank {rank}, but only {trained} "
                       f"steps were trained before the kill: steps {trained + 1}-{s} were never trained", None,
                       "resume the step count saved with the weights, not a later one")
    complete = _restored_point(run, first)
    if s == 0 and complete >= 1:
        loaded = [load for load in restart.loads if load.what in ("module", "torch.load")]
        cause = None if loaded else "no checkpoint was loaded at the restart (no torch.load or load_state_dict call)"
        return Finding("steps", rank, 1, f"the restart trained from step 1 again on rank {rank} although the "
                       f"checkpoint of step {complete} was complete: steps 1-{complete} were trained twice",
                       cause, "load the latest complete checkpoint in ctx.checkpoint_dir at start-up")
    return None


def _raised_finding(run: Run, rank: int, restart: Life) -> Finding:
    """The restart raised: a torn checkpoint, a refused one, or no known cause (then the fix is
    the line the message points at; an atomic save is recommended only for a torn file)."""
    torn, refused = _torn_cause(run, restart), _refused_cause(restart)
    fix = ("write the checkpoint to a temporary file and rename it (os.replace) on one rank, then a barrier, so a "
           "kill during the save leaves the previous one whole" if torn else
           "save only state_dict()s and plain values (numbers, strings, lists, dicts) in the checkpoint, or load "
           "your own job's checkpoints with torch.load(..., weights_only=False)" if refused else
           "fix what the restart raised at the line shown: the first start ran the same code without it")
    return Finding("raised", rank, None, f"run_loop raised on restart on rank {rank}: {restart.raised}",
                   torn or refused, fix)


def _shard_save_cause(run: Run) -> str | None:
    """Measured (``SaveRecord.sharded``): fewer ranks than the world saved a checkpoint holding
    FSDP2 shards, so it holds those ranks' parts of the model only, and every rank restarts
    from them (DDP's ``if rank == 0: torch.save(model.state_dict())`` kept through the port)."""
    savers = sorted({life.rank for life in run.first for s in life.saves if s.inside and s.sharded})
    if not savers or len(savers) == len(run.first):
        return None
    most = max(s.sharded for life in run.first for s in life.saves if s.inside)
    return (f"only rank(s) {savers} saved the checkpoint, and it holds {most} FSDP2 shard(s) (DTensors): "
            f"under fully_shard model.state_dict() is each rank's own shard, so the checkpoint has one "
            f"rank's part of the model and every rank restarts from it; gather the full state dict on "
            f"every rank (torch.distributed.checkpoint.state_dict.get_state_dict(model, optimizer, "
            f"options=StateDictOptions(full_state_dict=True))) or save with torch.distributed.checkpoint "
            f"on every rank")


def judge_run(a: list[Life], run: Run, folder: Path) -> Verdict:
    """The killed scenario ``run`` against the uninterrupted lives ``a``, on every rank."""
    between = run.plan.kind == "after-step"
    # A later save of the round, over a file of an earlier round, is the one torn (during_save_plan).
    what = f"{run.plan.path} (over the file an earlier save wrote)" if run.plan.path else "its checkpoint"
    kill = (f"whole world stopped after step {run.plan.step}, its checkpoint folder copied there (what a "
            f"SIGKILL leaves), restarted on the copy" if run.copied and between else
            f"rank {run.plan.rank} stopped half-way through writing {what} after step {run.plan.step}, "
            f"the other ranks stopped with it, the checkpoint folder copied there (what a SIGKILL leaves), "
            f"restarted on the copy" if run.copied else
            f"whole world SIGKILLed after step {run.plan.step}" if between else
            f"rank {run.plan.rank} SIGKILLed while writing {what} after step {run.plan.step}, "
            f"the other ranks torn down")
    findings: list[Finding] = []
    warnings: list[str] = []
    resumed_at: dict[int, int] = {}
    samples: dict[int, dict[str, int]] = {}
    compared = 0
    raised = any(life.ended == "raised" for life in run.restart)
    for rank, (ref, first, restart) in enumerate(zip(a, run.first, run.restart)):
        n = len(ref.steps)
        if raised and restart.ended != "raised":
            continue  # torn down because a peer raised: that peer is the finding
        if restart.ended == "raised":
            findings.append(_raised_finding(run, rank, restart))
            continue
        s = n - len(restart.steps)
        resumed_at[rank] = s + 1
        finding = _steps_finding(rank, n, s, run, first, restart)
        if finding is not None and (s < 0 or not restart.steps or s > len(first.steps)):  # nothing aligns
            findings.append(finding)
            continue
        samples[rank] = sample_counts(ref, first, restart, s)
        va = Values(folder, "uninterrupted", 1, ref)
        vr = Values(folder, run.scenario, 2, restart)
        found, steps = _first_finding(rank, s, ref, first, restart, va, vr, warnings)
        compared += steps
        if finding is not None:
            findings.append(finding)
        elif found is not None:
            findings.append(found)
    shards = _shard_save_cause(run)
    if shards is not None:
        findings = [f if f.cause else replace(f, cause=shards) for f in findings]
    findings.sort(key=lambda f: (f.step if f.step is not None else -1, f.rank))
    return Verdict(run.scenario, kill, resumed_at, compared, findings, warnings, samples, trajectory(a, run))


def trajectory(a: list[Life], run: Run) -> dict[str, Any]:
    """Rank 0's parameter norm after every step: uninterrupted, before the kill, after the restart."""
    ref, first, restart = a[0], run.first[0], run.restart[0]
    n = len(ref.steps)
    return {"uninterrupted": [round(s.after.norm, 6) for s in ref.steps],
            "before_kill": [round(s.after.norm, 6) for s in first.steps],
            "resumed_from": n - len(restart.steps) + 1,
            "resumed": [round(s.after.norm, 6) for s in restart.steps],
            "kill_after": run.plan.step, "kill": run.plan.kind}
