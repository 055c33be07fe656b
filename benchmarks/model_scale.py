"""What the suite costs as the model grows: per check, its time in bare DDP steps and its peak
memory in model copies, for the same MLP target at 0.1 M .. >= 100 M parameters, 2 gloo ranks.

    python benchmarks/model_scale.py                                  # 0.1M 2M 8M 34M 100M, every check
    python benchmarks/model_scale.py --sizes 0.1M,2M,8M               # a quick run
    python benchmarks/model_scale.py --sizes 0.1M,8M --checks gradient-equivalence,bucket-config

For each size, in one run: a fresh suite session (its own persistent 2-rank world) measures a
bare DDP training step of the target (zero_grad, forward, loss, backward, optimizer step; the
median of several after two warm-up steps), then runs each selected check through
``Session.run_check`` -- exactly what a ``ddp-conformance run --target`` item runs -- and reads
the cost the harness records (conformance/harness/resources.py): the check's time, the
supervisor's peak RSS (exact: VmHWM reset per check) and the whole process tree's (supervisor +
ranks + their children, sampled). Printed per check: time / bare step, supervisor peak / model
bytes, tree peak / model bytes.

Then two ``ratio:`` lines, the figures the suite holds itself to:
- gradient-equivalence time / (6 x bare step) at the largest size that ran (its physical work is
  3 DDP steps + 3 reference steps; want <= 3);
- the supervisor's peak RSS (the largest over the checks) at the largest size vs the smallest
  (want <= 1.2: supervisor memory flat in the model size).

A size whose projected process-tree peak exceeds the host's available memory is skipped with
the reason printed (``--force`` runs it anyway). The projection is a line through the two
largest sizes that ran (the tree's peak is a fixed cost -- torch in every process -- plus a
number of model copies), with DEFAULT_TREE_COPIES as the slope while fewer than two ran, and
HEADROOM on top.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

if TYPE_CHECKING:
    from conformance.harness.world import RankContext

SIZES = {"0.1M": 100_000, "2M": 2_000_000, "8M": 8_000_000, "34M": 34_000_000, "100M": 100_000_000}
LAYERS, OUT = 4, 16  # LAYERS square Linear(W, W) layers and a Linear(W, OUT) head: ~LAYERS x W^2
BARE_WARMUP, BARE_STEPS = 2, 5
#: The process tree's peak in model copies before any size has run: the landed suite's, measured
#: before comparisons moved onto the ranks (8.3 GiB for a 134 MB model).
DEFAULT_TREE_COPIES = 65.0
#: Room left on top of the projection: a projection from a smaller size is not exact.
HEADROOM = 1.2
GRADIENT_CHECK = "gradient-equivalence"


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


def bare_step(ctx: RankContext, target_spec: str, warmup: int, steps: int) -> float:
    """Median time of a plain DDP training step of the target on this rank (nothing of the suite
    around it but a clock); the model is freed before returning."""
    from conformance.harness.ddp import PROBE_SEED, build_model, effective_ddp_kwargs, sync_device, wrap
    from conformance.harness.sharding import rank_batch
    from conformance.harness.targets import load_target

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
    return statistics.median(times)


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


def tree_slope(seen: list[tuple[int, int]]) -> float:
    """Extra tree bytes per extra model byte, from the two largest sizes that ran."""
    if len(seen) < 2 or seen[-1][0] == seen[-2][0]:
        return DEFAULT_TREE_COPIES
    (b0, t0), (b1, t1) = seen[-2], seen[-1]
    return max((t1 - t0) / (b1 - b0), 1.0)


def projected_tree(seen: list[tuple[int, int]], nbytes: int) -> int:
    """The process tree's projected peak for a model of ``nbytes``, with HEADROOM."""
    base_bytes, base_peak = seen[-1] if seen else (0, 0)
    return int((base_peak + tree_slope(seen) * (nbytes - base_bytes)) * HEADROOM)


def run_size(label: str, path: str, checks: list[str], deadline: float) -> list[Row]:
    from conformance.harness.registry import BY_ID
    from conformance.harness.resources import model_size
    from conformance.harness.session import Session, Settings
    from conformance.harness.targets import load_target
    from ddp_conformance.reports.keys import SUPERVISOR_PEAK_RSS, TREE_PEAK_RSS

    size = model_size(load_target(path))
    if size is None:
        raise SystemExit(f"cannot size the target {path} on the meta device")
    params, nbytes = size
    session = Session(Settings(target=path, deadline=deadline),
                      progress=lambda line: print(line, file=sys.stderr, flush=True))
    rows = []
    try:
        # As `ddp-conformance run` does at session start: both worlds launch now, in parallel.
        session.prewarm(reference=any(BY_ID[cid].reference for cid in checks))
        # The bare step: the same world the checks then use, so the ratio is of like to like.
        step_s = max(r.value for r in session.world().run(bare_step, path, BARE_WARMUP, BARE_STEPS))
        print(f"[{label}] {params / 1e6:.2f} M parameters ({nbytes / 2**20:.1f} MiB), bare DDP step "
              f"{step_s * 1e3:.1f} ms", flush=True)
        for cid in checks:
            record, _ = session.run_check(BY_ID[cid], path)
            m = record.metrics
            rows.append(Row(label, params, nbytes, step_s, cid, record.status, record.duration_s,
                            m.get(SUPERVISOR_PEAK_RSS), m.get(TREE_PEAK_RSS)))
            print("  " + fmt_row(rows[-1]), flush=True)
            if record.status in ("failed", "inconclusive"):  # a cost is read with its outcome
                print(f"    {record.status}: {record.message.strip().splitlines()[0][:300] if record.message else ''}",
                      flush=True)
    finally:
        session.close()
    return rows


def _copies(value: int | None, nbytes: int) -> str:
    return f"{value / nbytes:7.1f}" if value is not None else "      —"


def fmt_row(r: Row) -> str:
    sup = f"{r.supervisor_peak / 2**20:7.0f}" if r.supervisor_peak is not None else "      —"
    tree = f"{r.tree_peak / 2**20:7.0f}" if r.tree_peak is not None else "      —"
    return (f"{r.check:24s} {r.status:12s} {r.duration_s:8.1f} s {r.duration_s / r.bare_step_s:8.1f} steps  "
            f"supervisor {sup} MiB = {_copies(r.supervisor_peak, r.model_bytes)} x model  "
            f"tree {tree} MiB = {_copies(r.tree_peak, r.model_bytes)} x model")


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
    args = parser.parse_args()
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    bad = [s for s in sizes if s not in SIZES]
    if bad:
        parser.error(f"--sizes: {', '.join(bad)} not among {', '.join(SIZES)}")
    checks = [c.strip() for c in args.checks.split(",")] if args.checks else [c.id for c in CHECKS]
    unknown = [c for c in checks if c not in BY_ID]
    if unknown:
        parser.error(f"--checks: unknown check id(s) {', '.join(unknown)}")
    sizes.sort(key=SIZES.__getitem__)

    rows: list[Row] = []
    seen: list[tuple[int, int]] = []  # (model bytes, the tree's peak over the checks) per size run
    with tempfile.TemporaryDirectory(prefix="model-scale-") as tmp:
        for label in sizes:
            width = width_for(SIZES[label])
            path = Path(tmp) / f"mlp_{label.replace('.', '_')}.py"
            path.write_text(target_source(width))
            nbytes = 4 * (LAYERS * (width * width + width) + width * OUT + OUT)
            need, slope, avail = projected_tree(seen, nbytes), tree_slope(seen), available_memory()
            if avail is not None and need > avail and not args.force:
                print(f"[{label}] skipped: projected process-tree peak {need / 2**30:.1f} GiB "
                      f"(~{slope:.0f} tree bytes per extra model byte, a {nbytes / 2**20:.0f} MiB model, "
                      f"x{HEADROOM}) > {avail / 2**30:.1f} GiB available (--force runs it anyway)", flush=True)
                continue
            done = run_size(label, str(path), checks, args.deadline)
            rows += done
            peaks = [r.tree_peak for r in done if r.tree_peak is not None]
            if peaks:
                seen.append((nbytes, max(peaks)))

    print()
    print(f"{'size':>6s} {'check':24s} {'status':12s} {'time':>10s} {'in steps':>14s}")
    for r in rows:
        print(f"{r.size:>6s} " + fmt_row(r))
    ran = [s for s in sizes if any(r.size == s for r in rows)]
    if not ran:
        print("ratio: n/a (no size ran)")
        return 1
    largest, smallest = ran[-1], ran[0]
    grad = [r for r in rows if r.size == largest and r.check == GRADIENT_CHECK]
    if grad:
        g = grad[0]
        print(f"ratio: {g.duration_s / (6 * g.bare_step_s):.2f} = {GRADIENT_CHECK} {g.duration_s:.1f} s / "
              f"(6 x bare step {g.bare_step_s * 1e3:.1f} ms) at {largest} (want <= 3)")
    else:
        print(f"ratio: n/a ({GRADIENT_CHECK} not selected)")

    def sup_peak(size: str) -> int | None:
        peaks = [r.supervisor_peak for r in rows if r.size == size and r.supervisor_peak is not None]
        return max(peaks) if peaks else None

    top, bottom = sup_peak(largest), sup_peak(smallest)
    if top is not None and bottom:
        print(f"ratio: {top / bottom:.2f} = supervisor peak RSS {top / 2**20:.0f} MiB at {largest} / "
              f"{bottom / 2**20:.0f} MiB at {smallest} (want <= 1.2)")
    else:
        print("ratio: n/a (no supervisor RSS measured)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
