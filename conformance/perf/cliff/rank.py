"""What the ``scaling-cliff`` check runs on every rank at one link rate: an all-reduce sweep
(for that rate's alpha-beta fit), then the target's own DDP steps, each after a plain (no-DDP)
forward+backward pass that times each gradient's readiness, in one call. The time between two
timed steps (the plain pass, the ranks lining up) is recorded too: the shaped link idles
through it and its token bucket refills (``cliff_model.ShapedLink``).

One call per rate, every part side by side: the link's rate is what the supervisor changed
between calls, so the fit and the step it predicts are measured under the same shaping; and
the compute the simulator is given (a plain pass) alternates with the DDP steps it is held
to, pass by pass, so a change of load on a shared host hits both.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ...harness.ddp import PROBE_SEED, build_model, effective_ddp_kwargs, logging_data, sync_device, wrap
from ...harness.patching import replaced
from ..measure import GradReadyRecorder, local_batch, sweep_on
from .host_barrier import HostBarrier

if TYPE_CHECKING:
    from ...harness.world import RankContext

#: Untimed DDP steps first: iteration 0 rebuilds the buckets, iteration 1 is still cold.
STEP_WARMUP = 2
#: Fewest timed steps a comm hook's steady state must hold to be judged alone (``steady_steps``).
MIN_STEADY = 4


def link_point(ctx: RankContext, target_spec: str, sizes: Sequence[int], *, steps: int, iters: int,
               bucket_cap_mb: float | None = None) -> dict[str, Any]:
    """World work function: the all-reduce sweep over ``sizes`` (``iters`` timed iterations
    each), then ``steps`` timed forward+backward steps of the target under DDP (``bucket_cap_mb``
    overrides the target's cap: the side-by-side re-run of another bucket layout)."""
    from ...harness.targets import load_target

    sweep = sweep_on(ctx.group, ctx.rank, ctx.world_size, ctx.device, sizes, warmup=1, iters=iters)
    target = load_target(target_spec)
    overrides = {} if bucket_cap_mb is None else {"bucket_cap_mb": bucket_cap_mb}
    ddp = wrap(build_model(target, ctx.device, seed=PROBE_SEED), ctx.device,
               effective_ddp_kwargs(target, overrides), target=target)
    plain = build_model(target, ctx.device, seed=PROBE_SEED)
    recorder = GradReadyRecorder(plain)
    inputs, targets = local_batch(target, ctx.rank, ctx.world_size, ctx.device)
    passes: list[tuple[float, float, dict[int, float]]] = []
    times: list[float] = []
    gaps: list[float] = []  # from one timed step's end to the next one's start: the link idles
    hooked: list[list[int]] = []  # per timed step, the bytes of each all-reduce a comm hook made
    first_ready: list[float | None] = []  # per timed step: when its first gradient was ready
    watch = FirstGradient()
    end: float | None = None
    barrier = HostBarrier(ctx.tmpdir / f"cliff-barrier-{ctx.generation}", ctx.rank, ctx.world_size,
                          timeout_s=ctx.pg_timeout_s)
    for i in range(STEP_WARMUP + steps):
        plain_pass = _plain_pass(target, plain, recorder, inputs, targets, ctx.device)
        if i == 0:
            watch.attach(ddp.module, plain_pass[2])
        # The plain pass takes a different time on each rank: line the ranks up again (outside
        # the timed step), so that the DDP step starts together on every rank, as each step of
        # a training loop does after the previous step's all-reduce. Not over the network: a
        # barrier's packets would take tokens from the shaped link just before the step.
        barrier.wait()
        ddp.zero_grad(set_to_none=True)
        sync_device(ctx.device)
        sent: list[int] = []
        t0 = watch.start()
        # backward() returns once DDP has waited for every bucket's all-reduce: this is the
        # whole overlapped step that the simulator predicts.
        with hook_all_reduces(sent):
            target.compute_loss(ddp, inputs, targets).backward()
        sync_device(ctx.device)
        if i >= STEP_WARMUP:
            times.append(time.perf_counter() - t0)
            hooked.append(sent)
            first_ready.append(watch.take())
            passes.append(plain_pass)
            if end is not None:
                gaps.append(t0 - end)
        end = time.perf_counter()
    recorder.remove()
    watch.remove()
    barrier.close()
    # A comm hook may change what it sends after a few steps (PowerSGD's plain all-reduces until
    # start_powerSGD_iter): the step judged is the one the hook settled into, as every later
    # step of a training run is. Every rank runs the same steps, so each keeps the same ones.
    settled = steady_steps(hooked)
    times, hooked = [times[i] for i in settled], [hooked[i] for i in settled]
    first_ready = [first_ready[i] for i in settled]
    broadcasts = broadcast_sizes(ddp)
    sizes_b = [p.numel() * p.element_size() for p in plain.parameters()]
    forward, backward, ready = zip(*passes)
    last = statistics.median(backward)
    profile = {"forward_s": statistics.median(forward), "backward_end_s": last, "forward": list(forward),
               "backward": list(backward), "nbytes": sizes_b, "names": recorder.names,
               "ready_s": [statistics.median(r.get(i, last) for r in ready) for i in range(len(sizes_b))]}
    return {"sweep": sweep, "step_times": times, "logging": logging_data(ddp), "profile": profile,
            "buffer_bytes": sum(broadcasts), "buffer_messages": len(broadcasts), "gaps": gaps,
            "hook_traffic": _hook_traffic(hooked), "first_ready": first_ready}


class FirstGradient:
    """When, in each timed DDP step, the gradient that the plain pass readied first is ready on
    this rank (s from the step's start; None if it never was): the ranks' readiness skew
    (``cliff_model.launch_skew``). One hook on one parameter, a timestamp and nothing else --
    DDP's own hooks and buckets are untouched."""

    def __init__(self) -> None:
        self.t0 = 0.0
        self._at: float | None = None
        self._handle: Any = None

    def attach(self, module: Any, ready: dict[int, float]) -> None:
        """Watch, on ``module`` (DDP's), the parameter whose gradient was ready first in a plain
        pass (``ready``: {parameter index: s}); both models are built alike, so indices agree."""
        params = list(module.parameters())
        first = min(ready, key=ready.__getitem__) if ready else len(params)
        if first < len(params) and params[first].requires_grad:
            self._handle = params[first].register_post_accumulate_grad_hook(self._hook)

    def _hook(self, _param: Any) -> None:
        if self._at is None:  # a tied parameter accumulates more than once: its first
            self._at = time.perf_counter()

    def start(self) -> float:
        """The step's start (``perf_counter``), from which the readiness is timed."""
        self._at = None
        self.t0 = time.perf_counter()
        return self.t0

    def take(self) -> float | None:
        return None if self._at is None else self._at - self.t0

    def remove(self) -> None:
        if self._handle is not None:
            self._handle.remove()
            self._handle = None


def hook_all_reduces(sent: list[int]) -> contextlib.AbstractContextManager[None]:
    """Append to ``sent`` the bytes of every ``torch.distributed.all_reduce`` made inside: a
    comm hook's (the stock fp16/bf16 compression and PowerSGD hooks call it, from DDP's thread
    and from their futures' callbacks, which complete before backward returns). DDP's own
    buckets go through its C++ reducer and are not counted: an empty list is DDP's layout."""
    import torch.distributed as dist

    def make(original: Any) -> Any:
        def counted(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            sent.append(tensor.numel() * tensor.element_size())
            return original(tensor, *args, **kwargs)
        return counted

    return replaced(dist, "all_reduce", make)


def steady_steps(hooked: Sequence[Sequence[int]]) -> list[int]:
    """Indices of the timed steps whose comm hook sent what the last one did (as many
    all-reduces, within a quarter of its bytes: a sparsifying hook's sizes vary a little): the
    hook's steady state. Every step without a hook, or when fewer than MIN_STEADY match.

    Measured (examples/train_compressed.py, PowerSGD from its 10th iteration, 24 timed steps
    after 2 warm-up ones): the first 8 steps were plain all-reduces of 1-3 ms, the rest
    compressed steps of 4-15 ms (the orthogonalisation costs this small model more than it
    saves). The lower quartile of the mixture was a plain step on the unshaped link and a
    compressed one behind the slowest, and the prediction, made for the compressed traffic,
    was 18-29 % off at rates where both kinds were judged."""
    if not hooked:
        return []
    calls, nbytes = len(hooked[-1]), sum(hooked[-1])
    settled = [i for i, sent in enumerate(hooked)
               if len(sent) == calls and abs(sum(sent) - nbytes) <= 0.25 * nbytes]
    return settled if len(settled) >= MIN_STEADY else list(range(len(hooked)))


def _hook_traffic(hooked: Sequence[Sequence[int]]) -> dict[str, float] | None:
    """What a comm hook put on the link per step (median over the steps it settled into,
    :func:`steady_steps`), or None when no hook all-reduced anything."""
    if not any(hooked):
        return None
    return {"bytes": statistics.median(sum(s) for s in hooked), "calls": statistics.median(len(s) for s in hooked)}


def broadcast_sizes(ddp: Any) -> list[int]:
    """Bytes of each broadcast DDP makes from rank 0 before every forward (``broadcast_buffers``,
    on by default: a positional-encoding table registered as a buffer crosses the link every
    step); empty when it makes none. DDP coalesces the buffers per dtype and device, up to its
    broadcast bucket size (``_broadcast_coalesced``): a BatchNorm's float statistics and its
    int64 step counter are two broadcasts, each paying the link's latency."""
    will_sync = getattr(ddp, "will_sync_module_buffers", None)
    if callable(will_sync) and not will_sync():
        return []
    buffers = getattr(ddp, "modules_buffers", None)
    if buffers is None:
        buffers = list(ddp.module.buffers()) if getattr(ddp, "broadcast_buffers", False) else []
    cap = int(getattr(ddp, "broadcast_bucket_size", 250 << 20)) or 1
    groups: dict[tuple[str, str], int] = {}
    for b in buffers:
        key = (str(b.dtype), str(b.device))
        groups[key] = groups.get(key, 0) + b.numel() * b.element_size()
    sizes: list[int] = []
    for nbytes in groups.values():
        full, rest = divmod(nbytes, cap)
        sizes += [cap] * full + ([rest] if rest else [])
    return sizes


def _plain_pass(target: Any, model: Any, recorder: GradReadyRecorder, inputs: Any, targets: Any,
                device: Any) -> tuple[float, float, dict[int, float]]:
    """(forward s, backward s, {parameter index: s into backward its gradient was ready}) of
    one forward+backward of the model without DDP: the compute the simulator is given."""
    model.zero_grad(set_to_none=True)
    sync_device(device)
    t0 = time.perf_counter()
    loss = target.compute_loss(model, inputs, targets)
    sync_device(device)
    t1 = time.perf_counter()
    recorder.start()
    loss.backward()
    sync_device(device)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, {k: v - recorder.t0 for k, v in recorder.ready.items()}
