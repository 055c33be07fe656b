"""Ctrl-C latency: SIGINT to ``ddp-conformance run`` -> every rank process gone.

    python benchmarks/interrupt_latency.py                 # 2 and 4 ranks, 3 rounds each
    python benchmarks/interrupt_latency.py --ranks 2 4 8 --rounds 5

Each round runs the real CLI on a target whose ranks are stuck in a collective (rank 0 never
enters the step's all-reduce; the others block inside it), waits until every rank is in its
step, sends SIGINT to the CLI process and times until no rank process is left (zombies count
as gone: they run nothing). Prints each latency and ``ratio:`` of the worst one to the 2 s
interrupt budget (conformance.harness.timing.INTERRUPT_BUDGET_S); want <= 1.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from conformance.harness.world import process_running

TAG = "DDP_BENCH_TAG"

TARGET = '''
import os, time
import torch.distributed as dist
from conformance.targets.mlp import build_model, ddp_kwargs, make_batch
from conformance.targets.mlp import loss_fn as loss_fn


def train_step(model, optimizer, microbatches, loss_fn):  # noqa: F811
    if not dist.is_initialized() or dist.get_world_size() == 1:
        raise SystemExit("not a bench world")
    open(os.path.join(os.environ["DDP_BENCH_READY"], str(os.getpid())), "w").close()
    if dist.get_rank() == 0:
        while True:          # rank 0 never reaches the all-reduce ...
            time.sleep(0.05)
    optimizer.zero_grad()
    inputs, targets = microbatches[0]
    loss_fn(model(inputs), targets).backward()   # ... so the others block inside it
    optimizer.step()
'''


def one_round(ranks: int, work: Path) -> float:
    ready = work / f"ready-{uuid.uuid4().hex[:6]}"
    ready.mkdir()
    env = {**os.environ, "DDP_BENCH_READY": str(ready), "OMP_NUM_THREADS": "1", TAG: uuid.uuid4().hex}
    proc = subprocess.Popen(
        [sys.executable, "-m", "conformance", "run", "--backend", "gloo", "--world-size", str(ranks),
         "--target", str(work / "stuck_target.py"), "--checks", "gradient-equivalence",
         "--deadline", "120", "--report-dir", str(work / f"out-{ranks}")],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        until = time.monotonic() + 180
        while len(list(ready.iterdir())) < ranks:
            if time.monotonic() > until or proc.poll() is not None:
                raise RuntimeError(f"the ranks never got stuck (exit {proc.poll()})")
            time.sleep(0.02)
        time.sleep(0.3)  # the blocked ranks are inside the all-reduce by now
        pids = [int(p.name) for p in ready.iterdir()]
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        while any(process_running(pid) for pid in pids):
            if time.monotonic() - sent > 60:
                raise RuntimeError(f"ranks {pids} still alive 60 s after Ctrl-C")
            time.sleep(0.005)
        latency = time.monotonic() - sent
        proc.wait(timeout=60)
        return latency
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def main() -> None:
    from conformance.harness.timing import INTERRUPT_BUDGET_S

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    worst = 0.0
    with tempfile.TemporaryDirectory(prefix="interrupt-bench-") as tmp:
        work = Path(tmp)
        (work / "stuck_target.py").write_text(TARGET)
        for ranks in args.ranks:
            latencies = [one_round(ranks, work) for _ in range(args.rounds)]
            worst = max(worst, *latencies)
            print(f"{ranks} ranks stuck in a collective: Ctrl-C -> all ranks gone in "
                  + ", ".join(f"{t:.3f}" for t in latencies) + " s")
    print(f"worst {worst:.3f} s vs the {INTERRUPT_BUDGET_S:g} s budget")
    print(f"ratio: {worst / INTERRUPT_BUDGET_S:.3f}")


if __name__ == "__main__":
    main()
