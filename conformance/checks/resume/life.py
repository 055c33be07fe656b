"""One life of the target's run_loop on one rank: the loop run with the probes attached,
every optimizer step journaled, and the planned kill carried out (``live``, a world's work
function). The uninterrupted run is a life with no kill; a killed run is two lives on the
same checkpoint folder, each in a fresh world (or the uninterrupted life's folder copied at
the kill point, and a restart on the copy).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from ...harness.batches import first_dim
from ...harness.observe import LoaderIndices, Observation, OptimizerSteps, Probe, Slice, Step
from ...harness.world import RankContext
from .observers import (
    KILL_BARRIER_S,
    VALUES_CAP,
    Journal,
    Listing,
    Loads,
    Samples,
    Saves,
    _clean,
    die,
    plain,
    rng_digest,
)
from .records import KillPlan, Snapshot, StepRecord, journal_path, marker, values_path


#: torch.distributed.checkpoint's ``set_optimizer_state_dict`` / ``get_state_dict`` create a fresh
#: optimizer's state with an ``optimizer.step()`` at lr 0 on zero gradients (``_init_optim_state``):
#: no training step, and counted as one it would shift every resumed step by one.
_STATE_INIT = ("_init_optim_state", f"distributed{os.sep}checkpoint{os.sep}state_dict.py")


def _initialising_state() -> bool:
    """True inside torch.distributed.checkpoint's optimizer state initialisation (``_STATE_INIT``)."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == _STATE_INIT[0] and frame.f_code.co_filename.endswith(_STATE_INIT[1]):
            return True
        frame = frame.f_back
    return False


class Steps(Probe):
    """The optimizer steps, seen through the optimizer-step probe (torch's global step pre/post
    hooks: every optimizer the loop creates, however it creates it; and ``GradScaler.step``: the
    scalers the loop uses are found there). At each step's entry the state it starts from is
    taken, at its return the state it produced; then the step ends for every probe (``ended``:
    the driver's ``end_step``, which merges their slices and journals the step), and the kill
    planned after this step (if any) is carried out."""

    def __init__(self, journal: Journal, models: list[Any], plan: KillPlan,
                 rank: int, world_size: int, markers: Callable[[str], Path],
                 copy: tuple[Path, Path] | None = None) -> None:
        self.journal, self.models, self.plan = journal, models, plan
        self.rank, self.world_size, self.markers = rank, world_size, markers
        self.copy = copy  # (the checkpoint folder, where to copy it): see ``_copy_here``
        self.optimizers: list[Any] = []
        self.scalers: list[Any] = []
        self.index = 0
        self.before: Snapshot | None = None
        self.after: Snapshot | None = None
        self.rng_at_step: str | None = None  # torch's RNG state at optimizer.step()'s entry
        #: Every probe's slice of a step, merged and journaled (``Observation.end_step``).
        self.ended: Callable[[Step], dict[str, Any]] = lambda step: {}

    def count(self) -> int:
        return self.index

    def _named(self) -> list[tuple[str, Any]]:
        if self.models:
            many = len(self.models) > 1
            return [((f"model{i}." if many else "") + _clean(n), p)
                    for i, m in enumerate(self.models) for n, p in m.named_parameters()]
        return [(f"optimizer{o}.param_groups[{g}][{i}]", p) for o, opt in enumerate(self.optimizers)
                for g, group in enumerate(opt.param_groups) for i, p in enumerate(group["params"])]

    def _optimizer_state(self) -> dict[str, tuple[int, str, float]]:
        import hashlib

        import torch

        from ...harness.ddp import tensor_digest

        by_key: dict[str, list[Any]] = {}
        for o, opt in enumerate(self.optimizers):
            for g in opt.param_groups:
                for p in g["params"]:
                    for key, value in opt.state.get(p, {}).items():
                        by_key.setdefault(f"optimizer{o}.{key}" if o else key, []).append(value)
        out = {}
        for key, values in by_key.items():
            tensors = [v if isinstance(v, torch.Tensor) else torch.tensor(float(v)) for v in values]
            digest = hashlib.sha1("".join(tensor_digest(t) for t in tensors).encode()).hexdigest()[:16]
            out[key] = (len(tensors), digest, float(sum(t.detach().double().abs().sum().item() for t in tensors)))
        return out

    def snapshot(self, *, values: bool) -> Snapshot:
        import torch

        from ...harness.ddp import tensor_digest

        named = self._named()
        size = sum(p.numel() * p.element_size() for _, p in named)
        offset = None
        # A life that will be killed is compared only by its steps and samples: no values.
        if values and size <= VALUES_CAP and self.plan.kind == "none":
            if not self.journal.layout_written:
                self.journal.write("layout", {"params": [(n, str(p.dtype).replace("torch.", ""), list(p.shape))
                                                         for n, p in named]})
                self.journal.layout_written = True
            offset = self.journal.values([p for _, p in named])
        with torch.no_grad():
            norm = float(sum(p.detach().double().pow(2).sum().item() for _, p in named)) ** 0.5
        lrs = [float(g["lr"]) for opt in self.optimizers for g in opt.param_groups]
        scalers = [(float(s.get_scale()), int(s._get_growth_tracker())) for s in self.scalers if s.is_enabled()]
        return Snapshot({n: tensor_digest(p) for n, p in named}, self._optimizer_state(), lrs, scalers,
                        norm, offset)

    def pre(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if _initialising_state():
            return
        if optimizer not in self.optimizers:
            self.optimizers.append(optimizer)
        self.before = self.snapshot(values=self.index == 0)
        self.rng_at_step = rng_digest()

    def post(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if _initialising_state():
            return
        self.index += 1
        self.after = self.snapshot(values=True)
        fields = self.ended(Step(self.index))
        if self.copy is not None:
            self._copy_here(int(fields.get("files", 0)))
        if self.plan.kind == "after-step" and self.index == self.plan.step:
            self._kill_here()

    def _kill_here(self) -> None:
        """Every rank waits here until all have journaled this step (marker files: a collective
        could hang on a rank already dead), then dies: the whole world, between two steps."""
        self.markers(f"at-{self.index}-rank{self.rank}").touch()
        until = time.monotonic() + KILL_BARRIER_S
        while time.monotonic() < until and not all(
                self.markers(f"at-{self.index}-rank{r}").exists() for r in range(self.world_size)):
            time.sleep(0.005)
        self.journal.write("end", {"how": "killed", "raised": None})
        die([])

    def _copy_here(self, files: int) -> None:
        """The killed-between-steps scenario's first life, taken from the uninterrupted one.

        At the first step after which every rank's listing shows a checkpoint (the kill point
        ``between_steps_plan`` picks from the same listings), every rank waits here while rank
        0 copies the checkpoint folder, then the life goes on. The copy is what a SIGKILL of
        the whole world at this point leaves on disk: the ranks are where ``_kill_here`` would
        kill them, a kill loses nothing the kernel already has (what a rank wrote is in the
        files, what it had not is in neither), and the restart is a fresh world on that folder
        as in a real kill (scenarios.Lives.from_copy). Up to then the ranks wait for nothing: a
        rank whose listing is empty says so (a marker) and goes on, so the uninterrupted run
        pauses once, for the copy; the kill during a save stays a real SIGKILL.
        """
        i = self.index
        self.markers(f"copy-{i}-rank{self.rank}-{'yes' if files else 'no'}").touch()
        if not files:
            return
        folder, to = self.copy  # type: ignore[misc]
        answers = self._answers(i)
        if answers is None or set(answers) != {"yes"}:
            if answers is None:
                self.copy = None  # a peer never answered: no copy (the check kills a first life instead)
            return
        self.copy = None
        if self.rank == 0:
            try:
                shutil.copytree(folder, to, symlinks=True)
            except OSError:  # shutil.Error too: no copy, and the check kills a first life instead
                copied = False
            else:
                copied = True
            self.markers(f"copied-{i}").touch()
            # A peer that stopped waiting went on during the copy: then it is no kill's folder.
            if copied and not any(self.markers(f"copy-{i}-gave-up-rank{r}").exists() for r in range(self.world_size)):
                self.journal.write("copied", {"step": i})
            return
        until = time.monotonic() + KILL_BARRIER_S
        while time.monotonic() < until and not self.markers(f"copied-{i}").exists():
            time.sleep(0.002)
        if not self.markers(f"copied-{i}").exists():
            self.markers(f"copy-{i}-gave-up-rank{self.rank}").touch()

    def _answers(self, i: int) -> list[str] | None:
        """Every rank's answer for step ``i`` ("yes": a checkpoint listed; "no", also for a rank
        whose loop has ended), None when one did not come within the kill barrier's time."""
        until = time.monotonic() + KILL_BARRIER_S
        while time.monotonic() < until:
            answers = []
            for r in range(self.world_size):
                if self.markers(f"copy-{i}-rank{r}-yes").exists():
                    answers.append("yes")
                elif self.markers(f"copy-{i}-rank{r}-no").exists() or self.markers(f"copy-end-rank{r}").exists():
                    answers.append("no")
            if len(answers) == self.world_size:
                return answers
            time.sleep(0.002)
        return None

    def scaler_step(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def step(scaler: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
            if scaler not in self.scalers:
                self.scalers.append(scaler)
            return original(scaler, optimizer, *args, **kwargs)

        return step

    def end_step(self, step: Step) -> Slice:
        return {"before": self.before, "after": self.after, "rng_at_step": self.rng_at_step}

    def attach(self, stack: contextlib.ExitStack) -> None:
        OptimizerSteps(pre=self.pre, post=self.post, scaler_step=self.scaler_step).attach(stack)


def _journaled(journal: Journal) -> Callable[[Step, dict[str, Any]], None]:
    """Each step's merged slices written as the journal's step record: on disk before the kill
    planned after that step (the judge reads a killed life's steps from there)."""

    def write(step: Step, fields: dict[str, Any]) -> None:
        assert fields["before"] is not None and fields["after"] is not None
        journal.write("step", StepRecord(index=step.index, before=fields["before"], after=fields["after"],
                                         samples=fields.get("samples", []), rng=fields.get("rng"),
                                         dropout=bool(fields.get("dropout")),
                                         listing=str(fields.get("listing", "")),
                                         files=int(fields.get("files", 0)),
                                         drew=fields.get("rng") not in (None, fields["rng_at_step"]),
                                         indices=list(fields.get("indices", []))))

    return write


def live(rank_ctx: RankContext, target_spec: str, *, folder: str, checkpoints: str, scenario: str, life: int,
         plan: KillPlan, steps: int, every: int, copy_to: str | None = None,
         copy_in_save: tuple[KillPlan, str] | None = None) -> int:
    """Run the target's ``run_loop`` on this rank as life ``life`` of ``scenario``; returns the
    optimizer steps taken (everything else is in the journal, which survives a kill).

    The user's exception on the first start is a TargetError (exit 2, as in every check); on a
    restart it is the check's finding (the first start ran fine), so it is journaled with its
    ``file:line`` and the rank fails with a plain error, which takes the world down at once.
    ``copy_to``: copy the checkpoint folder there at the between-steps kill point
    (``Steps._copy_here``); ``copy_in_save``: a during-save kill plan and where to copy the
    folder at its point (``observers.Saves._torn_copy``).
    """
    from ...harness.rank_run import RankRun
    from ...harness.target_calls import one_line
    from ...harness.targets import TargetError, call_target

    run = RankRun.load(rank_ctx, target_spec)
    target = run.target
    if target.run_loop is None:
        raise ValueError(f"target {target.name!r} defines no run_loop: there is no loop to restart")
    record_dir = Path(folder)
    rank = rank_ctx.rank
    markers = lambda name: marker(record_dir, scenario, life, name)  # noqa: E731
    markers(f"pid-rank{rank}").write_text(str(os.getpid()))
    scratch = Path(rank_ctx.tmpdir) / f"resume-rank{rank}"
    scratch.mkdir(parents=True, exist_ok=True)
    journal = Journal(journal_path(record_dir, scenario, life, rank), values_path(record_dir, scenario, life, rank))
    indices = LoaderIndices()
    samples = Samples(dim=first_dim(target.batch_dim), batches=indices)
    loop = run.loop_context(steps=steps, tmpdir=scratch, on_wrap=lambda model: _watched(model, samples),
                            checkpoint_dir=Path(checkpoints), checkpoint_every=every, restarts=life - 1)
    stepper = Steps(journal, loop.models, plan, rank, rank_ctx.world_size, markers,
                    (Path(checkpoints), Path(copy_to)) if copy_to else None)
    saves = Saves(journal, Path(checkpoints), plan, rank, stepper.count, markers, rank_ctx.world_size,
                  (copy_in_save[0], Path(copy_in_save[1])) if copy_in_save else None)
    observation = Observation([stepper, samples, Listing(Path(checkpoints)), indices, saves,
                               Loads(journal, Path(checkpoints))], journal=_journaled(journal))
    stepper.ended = observation.end_step
    run_loop = target.run_loop
    try:
        observation.run(lambda: call_target(target, "run_loop", run_loop, loop))
    except Exception as exc:
        text = str(exc) if isinstance(exc, TargetError) else plain(one_line(exc))[:400] + _user_line(target, exc)
        journal.write("end", {"how": "raised", "raised": text})
        if life == 1:
            raise
        raise RuntimeError(f"run_loop raised on restart: {text}") from None
    else:
        journal.write("end", {"how": "completed", "raised": None})
    finally:
        journal.close()
        if copy_to:
            markers(f"copy-end-rank{rank}").touch()  # a peer waiting for this rank's answer: "no"
    return stepper.index


def _watched(model: Any, samples: Samples) -> None:
    """Every life's model with dropout off, as the equivalence checks compare (issue 21: "dropout
    off, the noise floor"): a loop that does not save torch's RNG state (most do not) resumes an
    equally valid but different dropout stream, and the steps would not compare at all. Stochastic
    depth is dropout of a whole residual branch: off too (``disable_drop_path``). Randomness left
    after that (random masking, noise) is measured per step (``StepRecord.drew``)."""
    from ...harness.ddp import disable_dropout  # not the equivalence package: 0.2 s of imports per rank and life

    disable_dropout(model)
    disable_drop_path(model)
    samples.watch(model)


def disable_drop_path(model: Any) -> list[str]:
    """Set every stochastic depth rate in ``model`` to 0; the names of what was changed. Found
    by the convention its implementations share: a float ``drop_prob`` (timm's DropPath and
    DropBlock2d, and the copies in facebookresearch/dino, mae, deit, ConvNeXt, Swin), and
    torchvision's ``StochasticDepth`` (its ``p``)."""
    changed = []
    for name, module in model.named_modules():
        rate = getattr(module, "drop_prob", None)
        if isinstance(rate, float) and rate > 0:
            module.drop_prob = 0.0
            changed.append(name or type(module).__name__)
        elif (type(module).__name__ == "StochasticDepth" and type(module).__module__.startswith("torchvision.")
              and isinstance(getattr(module, "p", None), float) and module.p > 0):
            module.p = 0.0
            changed.append(name or type(module).__name__)
    return changed


def _user_line(target: Any, exc: BaseException) -> str:
    """`` at file:line`` of the innermost line of the user's in the exception's traceback
    (the suite's own wrappers, such as the observed ``torch.load``, may sit below it)."""
    import traceback

    from ...harness.target_calls import is_user_file, shown_path

    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if is_user_file(f.filename, target.user_files, target.user_dir)]
    return f" at {shown_path(frames[-1].filename)}:{frames[-1].lineno}" if frames else ""
