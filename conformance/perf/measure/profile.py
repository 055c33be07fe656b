"""When each gradient becomes ready during backward, measured with autograd hooks.

This is the input the step simulator needs from the model: DDP releases a bucket when its
last gradient is ready, so the per-gradient ready times (plus sizes) are the model's whole
contribution to the overlap. ``register_post_accumulate_grad_hook`` fires after the gradient
is accumulated into ``.grad`` — the same moment DDP's autograd hook marks it ready.
"""

from __future__ import annotations

import math
import statistics
import time
from typing import TYPE_CHECKING, Any

from ...harness.ddp import PROBE_SEED, build_model, sync_device
from ...harness.sharding import rank_batch
from ...harness.timing import DEFAULT_DEADLINE_S, MAX_SWEEP_REPS, MIN_SWEEP_REPS, sweep_reps
from ..maths import BackwardProfile

if TYPE_CHECKING:
    from ...harness.targets import Target
    from ...harness.world import RankContext

# Untimed warm-up passes; the timed repeats then follow the last warm-up's time
# (timing.sweep_reps: a fast model gets many, a production one the floor).
WARMUP = 2
#: The timed passes stop before sweep_reps' count once the median pass is known this closely:
#: the interquartile range over the square root of the count, as a share of the median. The
#: simulator this profile feeds is held to 25 % (allreduce-bandwidth's SIMULATOR_ERROR_BOUND),
#: so 5 % is plenty; a noisy host keeps measuring, up to the budget's count as before
#: (measured on a 2-core host at load 26: the passes' interquartile range was 0.3-1.4 of
#: their median, 10-17 % over the root of the count at 25 passes: the budget's count ran).
SETTLED_SHARE = 0.05


def settled(times: list[float], least: int = MIN_SWEEP_REPS) -> bool:
    """Whether ``least`` or more timed passes already pin their median (``SETTLED_SHARE``)."""
    if len(times) < max(least, 2):
        return False
    q = statistics.quantiles(times, n=4)
    return (q[2] - q[0]) / math.sqrt(len(times)) <= SETTLED_SHARE * statistics.median(times)


class GradReadyRecorder:
    """Timestamps of each parameter's gradient becoming ready in the current backward.

    The suite's instrumentation (benchmarks/instrumentation_overhead.py measures its cost):
    one hook per parameter that appends ``perf_counter()``; no synchronisation, no tensor work.
    """

    def __init__(self, model: Any) -> None:
        self.names: list[str] = []
        self.ready: dict[int, float] = {}
        self.t0 = 0.0
        self._handles: list[Any] = []  # torch.utils.hooks.RemovableHandle
        for index, (name, param) in enumerate(model.named_parameters()):
            self.names.append(name)
            if param.requires_grad:
                self._handles.append(param.register_post_accumulate_grad_hook(self._hook(index)))

    def _hook(self, index: int) -> Any:
        def hook(_param: Any) -> None:
            # A shared (tied) parameter accumulates several times; the last one makes it ready.
            self.ready[index] = time.perf_counter()
        return hook

    def start(self) -> None:
        self.ready.clear()
        self.t0 = time.perf_counter()

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


def local_batch(target: Target, rank: int, world_size: int, device: Any) -> tuple[Any, Any]:
    """This rank's contiguous chunk of the target's global batch, drawn with the probe seed."""
    return rank_batch(target, rank, world_size, seed=PROBE_SEED,
                      batch_size=target.batch_size_for(world_size), device=device)


def profile_backward(ctx: RankContext, target_spec: str, *, warmup: int = WARMUP, repeats: int | None = None,
                     deadline_s: float = DEFAULT_DEADLINE_S) -> dict[str, Any]:
    """World work function: per-gradient ready times of the target model, no DDP, on this rank.

    ``repeats=None``: as many timed passes as the last warm-up pass's time affords within the
    sweep budget and ``deadline_s``, or fewer once their median is pinned (``settled``). No
    collective runs here, so the ranks need not agree.

    Returns a plain dict (picklable) that ``to_profile`` turns into a BackwardProfile.
    """
    from ...harness.targets import load_target

    target = load_target(target_spec)
    model = build_model(target, ctx.device, seed=PROBE_SEED)
    return profile_passes(ctx, target, model, warmup=warmup, repeats=repeats, deadline_s=deadline_s)


def profile_passes(ctx: RankContext, target: Target, model: Any, *, warmup: int = WARMUP,
                   repeats: int | None = None, deadline_s: float = DEFAULT_DEADLINE_S,
                   most: int = MAX_SWEEP_REPS) -> dict[str, Any]:
    """:func:`profile_backward` on a model already built (``measure.model_step`` builds one
    for the profile and the DDP steps after it), with at most ``most`` timed passes when
    ``repeats`` is None. The model's hooks are removed and its gradients freed before
    returning, so it can be wrapped next as it was built."""
    inputs, targets = local_batch(target, ctx.rank, ctx.world_size, ctx.device)
    recorder = GradReadyRecorder(model)
    sizes = [p.numel() * p.element_size() for p in model.parameters()]
    forward, backward, ready = [], [], []
    i, total = 0, warmup + (repeats if repeats is not None else 1)
    while i < total:
        model.zero_grad(set_to_none=True)
        sync_device(ctx.device)
        t0 = time.perf_counter()
        loss = target.compute_loss(model, inputs, targets)
        sync_device(ctx.device)
        t1 = time.perf_counter()
        recorder.start()
        loss.backward()
        sync_device(ctx.device)
        t2 = time.perf_counter()
        if i >= warmup:
            forward.append(t1 - t0)
            backward.append(t2 - t1)
            ready.append({k: v - recorder.t0 for k, v in recorder.ready.items()})
        i += 1
        if i == warmup and repeats is None:
            total = warmup + min(most, sweep_reps(t2 - t0, points=1, deadline_s=deadline_s))
        elif repeats is None and settled([f + b for f, b in zip(forward, backward)]):
            break  # a production model's passes are long and steady: 5 of them, not the budget's 10-25
    recorder.remove()
    model.zero_grad(set_to_none=True)
    end = statistics.median(backward)
    # Parameters that got no gradient are marked ready at the end by DDP (find_unused) or
    # never: either way they cannot release a bucket earlier than backward's end.
    per_param = [statistics.median(r.get(i, end) for r in ready) for i in range(len(sizes))]
    order = sorted(range(len(sizes)), key=lambda i: (per_param[i], -i))
    return {"forward_s": statistics.median(forward), "backward_end_s": end,
            "order": order, "ready_s": [per_param[i] for i in order], "nbytes": [sizes[i] for i in order],
            "names": [recorder.names[i] for i in order], "repeats": len(backward)}


def to_profile(data: dict[str, Any]) -> BackwardProfile:
    return BackwardProfile(ready_s=tuple(data["ready_s"]), nbytes=tuple(data["nbytes"]),
                           backward_end_s=data["backward_end_s"], forward_s=data["forward_s"],
                           names=tuple(data["names"]))
