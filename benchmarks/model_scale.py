"""What the suite costs as the model grows: per check, its time in bare DDP steps and its peak
memory in model copies, for the same MLP target at 0.1 M .. >= 100 M parameters, 2 gloo ranks.

    python benchmarks/model_scale.py                                  # 0.1M 2M 8M 34M 100M, every check
    python benchmarks/model_scale.py --sizes 0.1M,2M,8M               # a quick run
    python benchmarks/model_scale.py --sizes 0.1M,8M --checks gradient-equivalence,bucket-config

For each size, in one run: a fresh suite session (its own persistent 2-rank world and 1-rank
reference world) reads every rank process's RSS before any model is built (torch imported: the
*baseline*), measures the user's own DDP training step of the target on the N-rank world (its
optimizer and ``ddp_kwargs``, at the suite's per-rank batch: zero_grad, forward, loss, backward,
optimizer step; the median of several after two warm-up steps, with the rank process's peak
RSS, VmHWM reset first), then runs each selected check through ``Session.run_check`` --
exactly what a ``ddp-conformance run --target`` item runs -- and reads the cost the harness
records (conformance/harness/resources.py): the check's time, the supervisor's peak RSS (exact:
VmHWM reset per check), every process's own peak (exact: each descendant's VmHWM reset at the
check's start) and the whole process tree's (summed, sampled). Printed per check: time / bare
step; ``rank/step``: the largest process's peak over the baseline / the training step's
per-rank peak over the baseline, and which process that was (``rank r``, ``reference``, or a
fresh world's ``pid``); on CUDA also ``device``: per device, the sum of the persistent
processes' ``torch.cuda.max_memory_allocated`` there / the training step's; supervisor and tree
peaks in model copies.

With ``--work`` (CPU ranks): a stack sampler in every rank process (``stack_sampler/``,
``work_share.py``) splits each check's time into *work* -- the target's own forwards,
backwards, all-reduces and optimizer steps, as many as the check's design runs -- and the rest,
the check's overhead; printed per check as ``work`` in bare steps, and summed as
``suite_work_steps`` at the largest size: what the suite would cost with no overhead at all.

Then, at the largest size that ran, the lines the goals are read from:
``per_rank_memory`` (the largest ``rank/step``, want <= 1.25), ``per_device_memory`` (CUDA;
skipped with the reason on CPU), ``gradient_equivalence_cost`` (its time / (6 x bare step):
its physical work is 3 DDP steps + 3 reference steps; want <= 1.5), ``suite_cost_steps`` (the
selected checks' times summed, in bare steps; want <= 60 for the full suite) and the
supervisor's peak at the largest size vs the smallest (``ratio:``, want <= 1.2).

A size is skipped only when the host cannot hold the training itself (STEP_COPIES copies of
the model on each rank and in the reference, with HEADROOM); otherwise it runs under a guard
that closes its worlds when less than LOW_MEMORY of host memory is left (``--force`` runs
every size). A projection of the tree's peak from a smaller size is not used to skip: what
does not grow with the model (torch and a step's buffers in every process, the fresh worlds'
processes) dominates a small size's peak, and a line through it over-predicted 100 M several
times over. Sizes beyond the host are projected per rank instead (``projection_1B``): a rank's
peak over torch's is model copies, so the largest size's ratio carries over.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import work_share  # noqa: E402 - benchmarks/work_share.py, beside this file

if TYPE_CHECKING:
    from conformance.harness.world import RankContext

SIZES = {"0.1M": 100_000, "2M": 2_000_000, "8M": 8_000_000, "34M": 34_000_000, "100M": 100_000_000}
LAYERS, OUT = 4, 16  # LAYERS square Linear(W, W) layers and a Linear(W, OUT) head: ~LAYERS x W^2
BARE_WARMUP, BARE_STEPS = 2, 5
#: Room left on top of a size's least need (the training step's copies).
HEADROOM = 1.2
#: Copies of the model a rank's training step holds: parameters, gradients, DDP's buckets, and
#: an optimizer state's (SGD with momentum; Adam holds two).
STEP_COPIES = 4
#: Model copies in the training step's per-rank peak up to which that peak is the model's
#: (parameters, gradients, buckets, optimizer state: 3-5), so its ratio projects to 1 B.
MODEL_DOMINATED = 8.0
#: The host memory a size's run may leave before MemoryGuard stops it.
LOW_MEMORY = 2 << 30
GRADIENT_CHECK = "gradient-equivalence"
#: ``--work``: the stack sampler's directory (the rank processes' PYTHONPATH) and its variable.
SAMPLER = Path(__file__).resolve().parent / "stack_sampler"
SAMPLE_DIR_ENV = "DDP_CONFORMANCE_SAMPLE_DIR"
#: Longer than the sampler's flush period (1 s): a reading then has every sample before it.
FLUSH_WAIT_S = 1.2


def width_for(params: int) -> int:
    """The MLP width whose parameter count is closest to ``params`` (solves LAYERS W^2 + ... = P)."""
    a, b = LAYERS, LAYERS + OUT + 1  # LAYERS (W^2 + W) + (W x OUT + OUT)
    return max(2, round((-b + math.sqrt(b * b + 4 * a * params)) / (2 * a)))


def target_source(width: int) -> str:
    return textwrap.dedent(f'''\
        """benchmarks/model_scale.py: an MLP of width {width}, {LAYERS} square layers."""
        from __future__ import annotations

        import torch
        from torch import nn

        WIDTH, LAYERS, OUT = {width}, {LAYERS}, {OUT}
        ddp_kwargs = {{"find_unused_parameters": False}}


        def build_model() -> nn.Module:
            layers: list[nn.Module] = []
            for _ in range(LAYERS):
                layers += [nn.Linear(WIDTH, WIDTH), nn.Tanh()]
            return nn.Sequential(*layers, nn.Linear(WIDTH, OUT))


        def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
            return (torch.randn(batch_size, WIDTH, generator=generator),
                    torch.randn(batch_size, OUT, generator=generator))


        def loss_fn(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            return nn.functional.mse_loss(outputs, targets)
        ''')


def _own_kib(field: str) -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith(field + ":"))


def rank_rss(ctx: RankContext) -> int:
    """World work function: this rank process's RSS now, in bytes (called before any model is
    built: torch imported and the process group joined, the baseline every peak is taken over)."""
    return _own_kib("VmRSS") * 1024


def cuda_peaks(ctx: RankContext, reset: bool) -> dict[str, int] | None:
    """World work function: this rank's ``torch.cuda.max_memory_allocated`` on its device
    (``reset``: the peak statistics reset first, at a check's start); None off CUDA."""
    import torch

    if ctx.device.type != "cuda":
        return None
    if reset:
        torch.cuda.reset_peak_memory_stats(ctx.device)
    return {str(ctx.device): int(torch.cuda.max_memory_allocated(ctx.device))}


@dataclass(frozen=True, slots=True)
class Step:
    """The user's own training step on one rank: its median time, the rank process's peak RSS
    over those steps, and its device's peak allocation (CUDA only)."""

    seconds: float
    peak_rss: int
    cuda_peak: dict[str, int] | None


def bare_step(ctx: RankContext, target_spec: str, warmup: int, steps: int) -> Step:
    """A plain DDP training step of the target on this rank, as the target defines it (its
    optimizer, its ``ddp_kwargs``), at the suite's per-rank batch, nothing of the suite around
    it but a clock and the process's peak RSS (VmHWM reset first); the model is freed before
    returning."""
    import torch

    from conformance.harness.ddp import PROBE_SEED, build_model, effective_ddp_kwargs, sync_device, wrap
    from conformance.harness.sharding import rank_batch
    from conformance.harness.resources import reset_peak
    from conformance.harness.targets import load_target

    reset_peak()
    cuda = ctx.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(ctx.device)
    target = load_target(target_spec)
    model = wrap(build_model(target, ctx.device, seed=PROBE_SEED), ctx.device, effective_ddp_kwargs(target))
    optimizer = target.make_optimizer(model)
    batch = rank_batch(target, ctx.rank, ctx.world_size, seed=0, device=ctx.device)
    times = []
    for step in range(warmup + steps):
        t0 = time.perf_counter()
        target.run_step(model, optimizer, [batch], step=step)
        sync_device(ctx.device)
        if step >= warmup:
            times.append(time.perf_counter() - t0)
    peak = _own_kib("VmHWM") * 1024
    device_peak = {str(ctx.device): int(torch.cuda.max_memory_allocated(ctx.device))} if cuda else None
    return Step(statistics.median(times), peak, device_peak)


@dataclass(frozen=True, slots=True)
class Row:
    size: str
    params: int
    model_bytes: int
    bare_step_s: float
    check: str
    status: str
    duration_s: float
    supervisor_peak: int | None
    tree_peak: int | None
    #: The largest process's peak over the baseline / the training step's per-rank peak over it,
    #: and which process that was ("rank 1", "reference", "pid 123": a fresh world's).
    rank_ratio: float | None = None
    rank_label: str = ""
    #: Per device: the sum of the suite's processes' CUDA peaks there / the training step's.
    device_ratio: float | None = None
    step_rss: int = 0  # the training step's per-rank peak over the baseline, at this size
    #: Seconds of the check's time that were its own training work (``--work``; work_share.py).
    work_s: float | None = None


@dataclass(frozen=True, slots=True)
class Baseline:
    """What every rank figure is measured over, per size."""

    rss: int  # a rank process's RSS once torch is imported (the smallest of the persistent ones)
    step_rss: int  # the training step's per-rank peak over ``rss`` (the largest rank's)
    step_cuda: int | None  # the training step's per-device CUDA peak (the largest device's)
    labels: dict[int, str]  # pid -> "rank r" / "reference"


def training_need(nbytes: int, world_size: int = 2) -> int:
    """The least a size needs: the user's own training at it, on every rank and in the
    reference (STEP_COPIES copies of the model each), with HEADROOM. A size that cannot hold
    this is skipped; above it, the size runs under :class:`MemoryGuard`."""
    return int((world_size + 1) * STEP_COPIES * nbytes * HEADROOM)


class MemoryGuard:
    """Stops a size when the host runs low, instead of projecting its peak beforehand.

    A projection from a smaller size is dominated by what does not grow with the model (torch
    and a step's buffers in every process, fresh worlds' processes): from 2 M it predicted
    31 GiB (then 57 GiB) for a 100 M run that peaks near 10 GiB. So the size runs, and a
    thread watching MemAvailable closes the session's worlds (their ranks exit) when less than
    LOW_MEMORY is left: the size is reported as stopped, and the host never swaps or kills."""

    def __init__(self, session: Any, label: str) -> None:
        import threading

        self.session, self.label, self.tripped = session, label, False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="memory-guard", daemon=True)

    def _watch(self) -> None:
        from conformance.harness.resources import available_memory

        while not self._stop.wait(0.2):
            left = available_memory()
            if left is not None and left < LOW_MEMORY:
                self.tripped = True
                print(f"[{self.label}] stopped: {left / 2**30:.1f} GiB of host memory left "
                      f"(< {LOW_MEMORY / 2**30:.0f} GiB); closing this size's worlds", flush=True)
                self.session.close()
                return

    def __enter__(self) -> MemoryGuard:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _labels(worlds: list[Any]) -> dict[int, str]:
    """pid -> the persistent process it is: "rank r" of the N-rank world, "reference"."""
    out: dict[int, str] = {}
    for world in worlds:
        pids = list(getattr(world, "pids", []))
        for rank, pid in enumerate(pids):
            out[pid] = "reference" if world.world_size == 1 else f"rank {rank}"
    return out


def _cuda(worlds: list[Any], *, reset: bool) -> dict[str, int]:
    """Per device: the sum of the persistent worlds' processes' CUDA peaks there (the reference
    shares a device with a rank: the device holds both)."""
    total: dict[str, int] = {}
    for world in worlds:
        for result in world.run(cuda_peaks, reset):
            for device, peak in (result.value or {}).items():
                total[device] = total.get(device, 0) + peak
    return total


def measure_baseline(session: Any, path: str, worlds: list[Any]) -> tuple[float, Baseline]:
    """(the bare step's time, the baseline): every persistent process's RSS before any model
    is built, then the user's training step on the N-rank world."""
    rss = [r.value for world in worlds for r in world.run(rank_rss)]
    # The bare step: the same world the checks then use, so the ratio is of like to like.
    steps: list[Step] = [r.value for r in session.world().run(bare_step, path, BARE_WARMUP, BARE_STEPS)]
    base = min(rss)
    cuda = [v for s in steps for v in (s.cuda_peak or {}).values()]
    baseline = Baseline(rss=base, step_rss=max(s.peak_rss for s in steps) - base,
                        step_cuda=max(cuda) if cuda else None, labels=_labels(worlds))
    return max(s.seconds for s in steps), baseline


def rank_memory(peaks: dict[str, int], baseline: Baseline) -> tuple[float | None, str]:
    """The largest process's peak over the baseline / the training step's per-rank peak over it."""
    if not peaks or baseline.step_rss <= 0:
        return None, ""
    pid, peak = max(peaks.items(), key=lambda kv: kv[1])
    label = baseline.labels.get(int(pid), f"pid {pid}")
    return (peak - baseline.rss) / baseline.step_rss, label


def _samples(folder: Path | None) -> dict[int, Any]:
    """The stack sampler's totals so far (after its next flush), or {} without ``--work``."""
    if folder is None:
        return {}
    time.sleep(FLUSH_WAIT_S)
    return work_share.read(folder)


def run_size(label: str, path: str, checks: list[str], deadline: float, samples: Path | None = None) -> list[Row]:
    """Every selected check on one size, under a MemoryGuard: its rows (``samples``: the stack
    sampler's folder, for each check's work)."""
    from conformance.harness.registry import BY_ID
    from conformance.harness.resources import model_size
    from conformance.harness.session import Session, Settings
    from conformance.harness.targets import load_target
    from ddp_conformance.reports.keys import PROCESS_PEAK_RSS, SUPERVISOR_PEAK_RSS, TREE_PEAK_RSS

    size = model_size(load_target(path))
    if size is None:
        raise SystemExit(f"cannot size the target {path} on the meta device")
    params, nbytes = size
    session = Session(Settings(target=path, deadline=deadline),
                      progress=lambda line: print(line, file=sys.stderr, flush=True))
    rows: list[Row] = []
    guard = MemoryGuard(session, label)
    try:
        guard.__enter__()
        # As `ddp-conformance run` does at session start: both worlds launch now, in parallel.
        reference = any(BY_ID[cid].reference for cid in checks)
        session.prewarm(reference=reference)
        worlds = [session.world()] + ([session.world(world_size=1)] if reference else [])
        step_s, base = measure_baseline(session, path, worlds)
        print(f"[{label}] {params / 1e6:.2f} M parameters ({nbytes / 2**20:.1f} MiB), bare DDP step "
              f"{step_s * 1e3:.1f} ms, its per-rank peak {base.step_rss / 2**20:.0f} MiB over "
              f"{base.rss / 2**20:.0f} MiB with torch imported"
              + (f", CUDA {base.step_cuda / 2**20:.0f} MiB" if base.step_cuda is not None else ""), flush=True)
        for cid in checks:
            if guard.tripped:
                break
            cuda = base.step_cuda is not None
            if cuda:
                _cuda(worlds, reset=True)
            before = _samples(samples)
            record, _ = session.run_check(BY_ID[cid], path)
            work = (work_share.work_seconds(before, _samples(samples), world_size=session.settings.world_size,
                                            reference={p for p, who in _labels(worlds).items() if who == "reference"})
                    if samples is not None else None)
            device = _cuda(worlds, reset=False) if cuda else {}
            m = record.metrics
            ratio, who = rank_memory(m.get(PROCESS_PEAK_RSS) or {}, replace(base, labels=_labels(worlds)))
            rows.append(Row(label, params, nbytes, step_s, cid, record.status, record.duration_s,
                            m.get(SUPERVISOR_PEAK_RSS), m.get(TREE_PEAK_RSS), ratio, who,
                            max(device.values()) / base.step_cuda if device and base.step_cuda else None,
                            base.step_rss, work))
            print("  " + fmt_row(rows[-1]), flush=True)
            if record.status in ("failed", "inconclusive"):  # a cost is read with its outcome
                print(f"    {record.status}: {record.message.strip().splitlines()[0][:300] if record.message else ''}",
                      flush=True)
    finally:
        guard.__exit__()
        session.close()
    return rows


def _copies(value: int | None, nbytes: int) -> str:
    return f"{value / nbytes:6.1f}" if value is not None else "     —"


def fmt_row(r: Row) -> str:
    sup = f"{r.supervisor_peak / 2**20:6.0f}" if r.supervisor_peak is not None else "     —"
    tree = f"{r.tree_peak / 2**20:6.0f}" if r.tree_peak is not None else "     —"
    rank = f"{r.rank_ratio:5.2f} ({r.rank_label})" if r.rank_ratio is not None else "    — "
    dev = f"  device {r.device_ratio:5.2f}" if r.device_ratio is not None else ""
    work = f" (work {r.work_s / r.bare_step_s:5.1f})" if r.work_s is not None else ""
    return (f"{r.check:24s} {r.status:12s} {r.duration_s:7.1f} s {r.duration_s / r.bare_step_s:7.1f} steps{work}  "
            f"rank/step {rank:18s}{dev}  supervisor {sup} MiB = {_copies(r.supervisor_peak, r.model_bytes)} x  "
            f"tree {tree} MiB = {_copies(r.tree_peak, r.model_bytes)} x model")


def summary(rows: list[Row], largest: str, smallest: str) -> list[str]:
    """The lines the goals are read from, at the largest size that ran."""
    at = [r for r in rows if r.size == largest]
    lines = []
    ranked = [r for r in at if r.rank_ratio is not None]
    if ranked:
        top = max(ranked, key=lambda r: r.rank_ratio or 0.0)
        lines.append(f"per_rank_memory: {top.rank_ratio:.2f} ({top.check}, {top.rank_label}; want <= 1.25)")
        # A rank's peak over torch's is copies of the model (the step's, the check's extra), so
        # it scales with the model: the ratio at the largest size carried to 1 B parameters.
        copies = top.step_rss / top.model_bytes
        at_1b = copies * 4e9
        lines.append(f"projection_1B: per rank ~{at_1b * (top.rank_ratio or 0.0) / 2**30:.1f} GiB over torch's "
                     f"(the training step ~{at_1b / 2**30:.1f} GiB, {copies:.1f} model copies at {largest}, "
                     f"x{top.rank_ratio:.2f})" if copies <= MODEL_DOMINATED else
                     f"projection_1B: n/a (the training step's peak at {largest} is {copies:.0f} model copies: "
                     f"not the model's, buffers and imports that do not grow with it; run a larger size)")
    else:
        lines.append("per_rank_memory: n/a (no process peak measured)")
    devices = [r for r in at if r.device_ratio is not None]
    lines.append(f"per_device_memory: {max(r.device_ratio or 0.0 for r in devices):.2f} (want <= 1.25)" if devices
                 else "per_device_memory: skipped (the ranks ran on CPU: no CUDA device, torch.cuda "
                      "peaks not measured; the CUDA path runs under --backend nccl on GPUs)")
    grad = [r for r in at if r.check == GRADIENT_CHECK]
    lines.append(f"gradient_equivalence_cost: {grad[0].duration_s / (6 * grad[0].bare_step_s):.2f} "
                 f"({grad[0].duration_s:.1f} s / (6 x bare step {grad[0].bare_step_s * 1e3:.1f} ms) at {largest}; "
                 f"want <= 1.5)" if grad else f"gradient_equivalence_cost: n/a ({GRADIENT_CHECK} not selected)")
    if at:
        steps = sum(r.duration_s for r in at) / at[0].bare_step_s
        lines.append(f"suite_cost_steps: {steps:.1f} ({len(at)} checks at {largest}; want <= 60)")
        if all(r.work_s is not None for r in at):
            work = sum(r.work_s or 0.0 for r in at) / at[0].bare_step_s
            lines.append(f"suite_work_steps: {work:.1f} of the {steps:.1f} (the target's own steps, passes and "
                         f"repetitions the checks' designs run; the rest is overhead)")

    def sup_peak(size: str) -> int | None:
        peaks = [r.supervisor_peak for r in rows if r.size == size and r.supervisor_peak is not None]
        return max(peaks) if peaks else None

    top_sup, bottom = sup_peak(largest), sup_peak(smallest)
    lines.append(f"ratio: {top_sup / bottom:.2f} = supervisor peak RSS {top_sup / 2**20:.0f} MiB at {largest} / "
                 f"{bottom / 2**20:.0f} MiB at {smallest} (want <= 1.2)" if top_sup is not None and bottom
                 else "ratio: n/a (no supervisor RSS measured)")
    return lines


def main() -> int:
    from conformance.harness.registry import BY_ID, CHECKS
    from conformance.harness.resources import available_memory

    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--sizes", default=",".join(SIZES),
                        help=f"comma-separated, from {', '.join(SIZES)} (default: all)")
    parser.add_argument("--checks", default=None,
                        help="comma-separated check ids (default: every check of the full suite)")
    parser.add_argument("--deadline", type=float, default=600.0, help="seconds per distributed call")
    parser.add_argument("--force", action="store_true", help="run sizes projected not to fit in memory")
    parser.add_argument("--work", action="store_true",
                        help="sample the rank processes' stacks: each check's own training work in bare steps")
    args = parser.parse_args()
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    bad = [s for s in sizes if s not in SIZES]
    if bad:
        parser.error(f"--sizes: {', '.join(bad)} not among {', '.join(SIZES)}")
    # The full suite's checks by default: scaling-cliff and ddp-migration are opt-in (in no
    # suite), and the goal is read from what `--suite full` runs.
    checks = ([c.strip() for c in args.checks.split(",")] if args.checks
              else [c.id for c in CHECKS if "full" in c.suites])
    unknown = [c for c in checks if c not in BY_ID]
    if unknown:
        parser.error(f"--checks: unknown check id(s) {', '.join(unknown)}")
    sizes.sort(key=SIZES.__getitem__)

    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="model-scale-") as tmp:
        samples = Path(tmp) / "stacks" if args.work else None
        if samples is not None:
            samples.mkdir()
            # Read by the worlds' zygotes at their exec (a zygote started without it is replaced).
            os.environ[SAMPLE_DIR_ENV] = str(samples)
            os.environ["PYTHONPATH"] = os.pathsep.join(
                [str(SAMPLER)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
        for label in sizes:
            width = width_for(SIZES[label])
            path = Path(tmp) / f"mlp_{label.replace('.', '_')}.py"
            path.write_text(target_source(width))
            nbytes = 4 * (LAYERS * (width * width + width) + width * OUT + OUT)
            need, avail = training_need(nbytes), available_memory()
            if avail is not None and need > avail and not args.force:
                print(f"[{label}] skipped: its training alone needs ~{need / 2**30:.1f} GiB ({STEP_COPIES} "
                      f"copies of a {nbytes / 2**20:.0f} MiB model on each of 2 ranks and the reference, "
                      f"x{HEADROOM}) > {avail / 2**30:.1f} GiB available (--force runs it anyway)", flush=True)
                continue
            rows += run_size(label, str(path), checks, args.deadline, samples)

    print()
    print(f"{'size':>6s} {'check':24s} {'status':12s} {'time':>9s} {'in steps':>13s}")
    for r in rows:
        print(f"{r.size:>6s} " + fmt_row(r))
    ran = [s for s in sizes if any(r.size == s for r in rows)]
    if not ran:
        print("per_rank_memory: n/a (no size ran)")
        return 1
    for line in summary(rows, ran[-1], ran[0]):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
