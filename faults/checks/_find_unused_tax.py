"""unused-parameters' tax: the step time of the target's DDP with find_unused_parameters=True
over False, on a step where every parameter is used (False cannot run otherwise).

    tax = measure_tax(ctx, world, source, seed, "target")   # {"false_s", "true_s", "tax", ...}

The ranks run ``tax_rank``: one model (the discovery's, ``_kept_model``), wrapped for one flag
at a time, TAX_REPS timed steps of each flag after its untimed ones, in three blocks. The check
measures it only where the figure decides a verdict or advice (``unused_parameters.tax_decides``).
"""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Any

from conformance.harness.targets import TargetError
from conformance.harness.timing import MIN_SWEEP_REPS

from ..scenarios import scenario_deadline
from ..vehicles import VehicleSpec, resolve
from ._kept_model import build_or_take

if TYPE_CHECKING:
    from conformance.harness.context import CheckContext
    from conformance.harness.world import RankContext, WorldLike

# Untimed steps of the tax after each wrap. With find_unused_parameters=False DDP rebuilds its
# buckets after the first step, in the order the gradients came: the first step builds them, the
# second runs the rebuilt ones. The first block's last untimed step sizes the timed ones against
# the deadline (timing.sweep_reps).
# With True it never rebuilds (torch's Reducer::should_rebuild_buckets): its one untimed step is
# the first use of its buckets and of the optimizer made for its wrap.
TAX_WARMUP = {False: 2, True: 1}
# The tax's blocks: the flag with the shorter warm-up outside, so two of the three wraps take it.
TAX_BLOCKS = (True, False, True)
#: Timed steps of each flag: the noise floor every timed sweep holds (MIN_SWEEP_REPS: a median
#: of five survives two outliers), no more. The budget is in the user's training steps, whose
#: count is the cost: sized by seconds (SWEEP_BUDGET_S), the tax took 7 a flag at 34 M
#: parameters and 25 at 8 M, up to 50 training steps for one ratio.
TAX_REPS = MIN_SWEEP_REPS


def tax_rank(ctx: RankContext, source: VehicleSpec | str, seed: int, deadline_s: float) -> dict[str, Any]:
    """Median step time with find_unused_parameters False and True: TAX_REPS timed steps of
    each (fewer where the deadline's share cannot hold them; the same count on every rank).

    One model per rank, re-wrapped for each flag (one DDP, with its gradient buckets, alive at
    a time, as in the bucket sweep): two models side by side held twice the training step's
    memory on every rank. The flags run in three blocks, TAX_BLOCKS (half of the outer flag's
    steps on each side of the other's), so a drift of the host's speed biases neither. The
    module is the one the check's previous call in this world left (``_kept_model``), else
    built here."""
    import gc

    from conformance.harness.ddp import PROBE_SEED, sync_device, wrap
    from conformance.harness.sharding import rank_batch
    from conformance.harness.resources import agreed_reps

    target = resolve(source, ctx.rank)
    kwargs = {k: v for k, v in target.ddp_kwargs.items() if k not in ("find_unused_parameters", "static_graph")}
    module, _ = build_or_take(target, source, PROBE_SEED)
    batch = rank_batch(target, ctx.rank, ctx.world_size, seed=seed, device=ctx.device)
    times: dict[bool, list[float]] = {False: [], True: []}
    steps, step, step_s = 0, 0, 0.0
    outer = TAX_BLOCKS[0]
    for block, flag in enumerate(TAX_BLOCKS):
        # This block's timed steps: half of the outer flag's (rounded up), all of the other's,
        # the outer one's rest.
        todo = None if not steps else steps if flag != outer else steps - len(times[outer])
        if todo == 0:
            continue
        # The first wrap broadcasts rank 0's module, as the user's does; a later one wraps the
        # module that DDP's averaged steps kept the same on every rank, for steps whose values
        # nobody reads: init_sync=False spares a broadcast of the whole model per re-wrap.
        resync = {} if block == 0 else {"init_sync": False}
        model = wrap(module, ctx.device, {**kwargs, "find_unused_parameters": flag, **resync}, target=target)
        optimizer = target.make_optimizer(model)
        warmup, k = TAX_WARMUP[flag], 0
        while todo is None or k < warmup + todo:
            t0 = time.perf_counter()
            target.run_step(model, optimizer, [batch], step=step)
            sync_device(ctx.device)
            elapsed = time.perf_counter() - t0
            step, k = step + 1, k + 1
            if k > warmup:  # skip the bucket build (and, find_unused_parameters=False, rebuild) steps
                times[flag].append(elapsed)
            if k == warmup and block == 0:  # the first block's warm-up sizes the measurement
                steps, step_s = agreed_reps(ctx, elapsed, points=2, deadline_s=deadline_s)
                steps = min(steps, TAX_REPS)
                todo = -(-steps // 2)
        # Synchronisation point: every rank drops this flag's DDP (its reducer's hooks and
        # buckets, in a reference cycle: collected now) and the gradients it left on the
        # module before the next wrap, so only one step's worth is ever alive.
        module.zero_grad(set_to_none=True)
        del model, optimizer
        gc.collect()
    return {"false_s": statistics.median(times[False]), "true_s": statistics.median(times[True]),
            "steps": steps, "warmup_step_s": step_s}


def measure_tax(ctx: CheckContext, world: WorldLike, source: VehicleSpec | str, seed: int,
                model: str) -> dict[str, Any]:
    """The find_unused_parameters tax (tax_rank) in ``world``: the slowest rank's medians and
    their ratio, or the error that left it unmeasured."""
    try:
        tax = world.run(tax_rank, source, seed, scenario_deadline(ctx))
    except TargetError:
        raise  # the user's own code raised: exit 2 with its line, not an unmeasured tax
    except Exception as exc:  # a random branch can still strike: the tax stays unmeasured
        return {"tax": None, "error": str(exc)[:500]}
    t_false = max(r.value["false_s"] for r in tax)
    t_true = max(r.value["true_s"] for r in tax)
    return {"false_s": round(t_false, 6), "true_s": round(t_true, 6), "tax": round(t_true / t_false, 3),
            "steps": tax[0].value["steps"], "warmup_step_s": round(tax[0].value["warmup_step_s"], 6),
            "model": model}
