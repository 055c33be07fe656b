"""The rank side: the target's ``evaluate`` on the DDP model, watched by the probes.

Runs on every rank of the N-rank world and on the 1-rank reference world. The model is built
from the suite's seed and wrapped in DDP with the target's ``ddp_kwargs`` (what training uses),
so both worlds evaluate the same weights (``params_digest`` proves it).
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from typing import Any, Mapping

from ...harness.batches import first_dim
from ...harness.world import RankContext
from ...harness.observe import CallRecords, LoaderIndices, Observation, UnevenGather
from .observers import Buffers, Forward, ShardReads
from .records import EvalRank, StepSlice

#: The seed of the global batch of the training step run right after evaluate.
STEP_SEED = 4321


@dataclass(frozen=True)
class EvalContext:
    """What a target's ``evaluate(model, ctx)`` receives (README, "Writing a target")."""

    rank: int
    world_size: int
    device: Any


def _params_digest(model: Any) -> str:
    from ...harness.ddp import tensor_digest, unwrap

    h = hashlib.sha1()
    for name, p in unwrap(model).named_parameters():
        h.update(f"{name}:{tensor_digest(p)}".encode())
    return h.hexdigest()[:16]


def _metrics(target: Any, returned: Any) -> dict[str, float]:
    """``evaluate``'s return value as {name: float}, or a TargetError saying what it was."""
    from ...harness.target_calls import defined_at
    from ...harness.targets import SEE, TargetError

    where = f"target {target.name!r}: evaluate (defined at {defined_at(target.evaluate)})"
    if not isinstance(returned, Mapping):
        raise TargetError(f"{where} returned a {type(returned).__name__}, not a dict of metric name -> "
                          f"float; return what training logs, e.g. {{'accuracy': 0.91}} ({SEE})")
    out: dict[str, float] = {}
    for key, value in returned.items():
        try:
            number = float(value)
        except (TypeError, ValueError, RuntimeError):
            raise TargetError(f"{where} returned {key!r}: {type(value).__name__}, not a number; return "
                              f"floats (a 1-element tensor: .item()) ({SEE})") from None
        out[str(key)] = number
    return out


def _distributed_call(target: Any, exc: BaseException) -> str | None:
    """``"recv at eval.py:16"``: the torch.distributed function the user's innermost line called
    when ``exc`` was raised in it (a timed-out receive or collective), or None. What a deadlock
    is named by: the ``CallRecords`` probe sees only the collectives it taps, never ``recv``."""
    import traceback

    from ...harness.target_calls import is_user_file, shown_path

    frames = traceback.extract_tb(exc.__traceback__)
    mine = [i for i, f in enumerate(frames) if is_user_file(f.filename, target.user_files, target.user_dir)]
    if not mine:
        return None
    line = frames[mine[-1]]
    below = frames[mine[-1] + 1:]
    # The first frame of torch.distributed's own below the user's line, past its logging
    # decorator (c10d_logger's ``wrapper``): the function the user called.
    called = next((f.name for f in below if f"{os.sep}torch{os.sep}distributed{os.sep}" in f.filename
                   and f.name != "wrapper"), None)
    return None if called is None else f"{called} at {shown_path(line.filename)}:{line.lineno}"


def _train_step(target: Any, model: Any, rank_ctx: RankContext) -> StepSlice:
    """One step of the target's ``train_step`` after ``model.train()``, as a loop resumes
    training after evaluating. An error of DDP (the reducer's "Expected to have finished
    reduction in the prior iteration" after an eval forward with autograd on) is data."""
    from ...harness.sharding import batch_dims, global_batch, shard, to_device
    from ...harness.target_calls import one_line
    from ...harness.targets import TargetError

    model.train()
    optimizer = target.make_optimizer(model)
    batch = global_batch(target, target.batch_size_for(rank_ctx.world_size, 1), seed=STEP_SEED)
    micro = to_device(shard(batch, rank_ctx.rank, rank_ctx.world_size, 1, dims=batch_dims(target)),
                      rank_ctx.device)
    try:
        target.run_step(model, optimizer, micro, step=0)
    except TargetError:
        raise
    except Exception as exc:  # noqa: BLE001 -- DDP's error on the user's model is a finding
        return StepSlice(ran=True, error=one_line(exc)[:400])
    return StepSlice(ran=True)


def evaluate_on_rank(rank_ctx: RankContext, target_spec: str, *, train_after: bool) -> EvalRank:
    """Build and wrap the model, run ``evaluate`` with every observer attached, then (with
    ``train_after``) one training step. The user's own exception is a TargetError (exit 2);
    any other (a collective's timeout, an uneven gather, DDP's error) comes back as data."""
    from ...harness.rank_run import RankRun
    from ...harness.target_calls import one_line
    from ...harness.targets import TargetError, call_target

    run = RankRun.load(rank_ctx, target_spec)
    target = run.target
    if target.evaluate is None:
        raise ValueError(f"target {target.name!r} defines no evaluate")
    # Construction broadcasts rank 0's parameters and buffers: a collective on every rank.
    ddp = run.build_wrapped().ddp
    digest = _params_digest(ddp)
    # Detached in reverse order (the Observation's stack), and before any slice is read.
    observation = Observation([LoaderIndices(fetched=True),
                               CallRecords(side_group=rank_ctx.side_group, world_size=rank_ctx.world_size),
                               Forward(ddp, dim=first_dim(target.batch_dim)), Buffers(ddp), ShardReads(ddp)])
    evaluate, eval_ctx = target.evaluate, EvalContext(rank_ctx.rank, rank_ctx.world_size, rank_ctx.device)
    metrics: dict[str, float] | None = None
    error = error_call = None
    started = time.perf_counter()
    try:
        returned = observation.run(lambda: call_target(target, "evaluate", evaluate, ddp, eval_ctx))
    except TargetError:
        raise
    except UnevenGather as exc:
        error = str(exc)
    except Exception as exc:  # noqa: BLE001 -- a timeout or DDP's error: reported with the slices
        error = one_line(exc)[:400]
        error_call = _distributed_call(target, exc)
    else:
        metrics = _metrics(target, returned)
    finally:
        seconds = time.perf_counter() - started
        # Each probe returns its own typed slice; the record takes them by field.
        slices = observation.result()
    # A rank whose evaluate raised does not train on: its peers' step then waits for it and
    # is released by the process group's (short) timeout, with its own error as data.
    step = _train_step(target, ddp, rank_ctx) if train_after and error is None else StepSlice(ran=False)
    return EvalRank(rank_ctx.rank, rank_ctx.world_size, metrics, error, digest, slices["forward"],
                    slices["samples"], slices["collectives"], slices["buffers"], step, round(seconds, 4),
                    error_call, slices["shard_reads"])
