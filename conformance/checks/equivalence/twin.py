"""The twin runs of the noise floor (``floor``): the same ``train_step`` in one process on the
N-rank run's microbatches, compared against the reference's snapshots as a rank compares.

Supervisor side. The twin splits the global batch into the N-rank run's N·K microbatches, in
rank order, and accumulates them in one process: it computes every per-microbatch gradient as
the ranks do and differs from the whole-batch reference by how the pieces are summed. A step
that joins its microbatches again (``torch.cat``, as a loader that yields one batch per step
does) computes exactly the reference's sum from them: the twin is then *bit-identical* to the
reference and measures a floor of 0 — while the N-rank run, whose ranks each reduce half the
batch before DDP averages, still differs in the last bits, and an optimizer that normalises
its update (Adam: ~lr per element whatever the gradient's size) turns those last bits of a
near-zero gradient into parameter differences of ~1e-5 after one step. A floor of 0 there is
no measurement, it is a twin that could not differ. So the twin then runs once more with its
microbatches in *reverse* order: the same microbatches (each one intact, so BatchNorm groups
and per-microbatch losses are unchanged), the same sum, another summation order — the
rounding of a reordered reduction, which is what DDP's all-reduce is (docs/numerics.md,
"The noise floor").

Before its first step the twin also measures whether the loss decomposes as a mean over
samples (``hypotheses.loss_split``: one forward of the global batch and one of each of its
N·K microbatches, each with a backward through the loss alone, not the model): a loss that
does not carries the N-rank run's weighting of the microbatches into the twin, and its
difference is then that weighting, not noise (``floor``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from ...harness.context import CheckContext
from ...harness.targets import TargetError
from ...harness.world import RankFailure, WorldError, WorldHang, first_line
from .tensors import Compared
from .floor import REORDERED
from .recording import RunPlan, run_recorded


def bit_identical(twin: dict[str, Any]) -> bool:
    """Did every tensor the twin compared equal the reference's exactly (gradients at the
    first step, before clipping, parameters after every step)?"""
    compared: list[Compared] = [*(twin.get("grads0") or []), *(twin.get("pre_clip0") or []),
                                *(c for step in twin.get("params") or [] for c in step)]
    return bool(compared) and all(c.got_present == c.ref_present and c.diff.max_abs == 0.0
                                  for c in compared)


def _run_twin(ctx: CheckContext, plan: RunPlan) -> dict[str, Any]:
    try:
        return dict(ctx.world(world_size=1).run(run_recorded, plan, deadline=ctx.deadline)[0].value)
    except (TargetError, RankFailure, WorldHang) as exc:
        # A step that refuses N·K microbatches (a fixed accumulation count, a memory limit) is
        # no finding about DDP, and no error in the target (its real split runs): no floor, the
        # fixed tolerances judge alone, and the record says why. (The failed call replaced the
        # 1-rank world; the snapshots are still in place.)
        said = exc.headline() if isinstance(exc, WorldError) else str(exc)
        # Past the deadline is no answer about the split (a loaded host, a slow model): the floor
        # is then missing, not refused, and a difference only it could explain is undecided.
        return {"failed": first_line(said.split("; fix it")[0]) or type(exc).__name__,
                "timed_out": isinstance(exc, WorldHang)}


def run_twin(ctx: CheckContext, plan: RunPlan, group: int, folder: Path) -> dict[str, Any]:
    """The twin (``floor``): the N-rank run's N·K microbatches, in rank order, accumulated in
    one process on the 1-rank world, compared against the reference's snapshots in ``folder``;
    run again in reverse order when it was bit-identical to the reference (the step joined
    them). A call of its own: in the reference's it would double that call's time, and a
    --deadline fitted to the N-rank step would fire on a correct large model."""
    twin_plan = replace(plan, microbatches=ctx.world_size * plan.microbatches, count_allreduce=False,
                        norm_group=group, snapshots=str(folder), uncompressed=True,
                        measure_loss_split=True)
    twin = _run_twin(ctx, twin_plan)
    if twin.get("failed") or not bit_identical(twin):
        return twin
    # The same pieces: the loss's decomposition is the first twin's (measured once).
    reordered = _run_twin(ctx, replace(twin_plan, reverse_microbatches=True, measure_loss_split=False))
    if reordered.get("failed"):
        return twin
    return {**reordered, REORDERED: True, **({"loss_split": twin["loss_split"]} if "loss_split" in twin else {})}
