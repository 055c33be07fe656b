"""The measured noise floor per configuration, the correct DDP difference and the smallest
injected bug's difference, side by side in one run.

    python benchmarks/noise_floor.py                  # every configuration, gloo, 2 ranks
    python benchmarks/noise_floor.py --configs fp32,bf16-autocast

Configurations: fp32 (the built-in MLP, SGD), bf16 autocast + GradScaler-style scaling + AdamW
(``examples/train_amp.py``), and the comm hooks of ``examples/train_compressed.py``: fp16, bf16
compression and PowerSGD (in its all-reduce warm-up: the checks' steps come before
``start_powerSGD_iter``). For each, gradient-equivalence runs on the correct target and on the
same target with the *smallest* scaling bug the check names: the loss divided by the world size
(gradient factor 1/N, off by 1 - 1/N = 0.5 of the gradient's scale on 2 ranks; the loss times
N is off by 1.0). Printed per configuration: the floor (the twin's largest relative gradient
difference), the bound (margin x floor, or the hook's compression bound), the correct run's
relative difference (and its ratio to the floor: what the margin must cover), the bug's, and
both verdicts. The last line is
``ratio: <smallest bug difference / largest correct difference across configurations>``
(want >= 10: a bug stands that far above the noise of every configuration).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from conformance.harness.registry import BY_ID
from conformance.harness.session import Session, Settings

EXAMPLES = ROOT / "examples"
COMPRESSED_HOOK = 'HOOK = os.environ.get("DDP_COMPRESS_HOOK", "fp16")'
FP32 = '''"""fp32: the built-in MLP with SGD (the benchmark's control)."""
import torch
from conformance.harness.targets import accumulate_step
from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

def train_step(model, optimizer, microbatches, loss_fn):
    accumulate_step(model, optimizer, microbatches, lambda m, x, y: loss_fn(m(x), y) / 1)
'''
#: config -> (source text, the loss line the bug divides by the world size)
Sources = dict[str, tuple[str, str]]


def _sources() -> Sources:
    amp = (EXAMPLES / "train_amp.py").read_text()
    compressed = (EXAMPLES / "train_compressed.py").read_text()
    out: Sources = {
        "fp32": (FP32, "loss_fn(m(x), y) / 1"),
        "bf16-autocast": (amp, "loss = loss_fn(model(tokens), labels) / k"),
    }
    for hook in ("fp16", "bf16", "powersgd"):
        out[f"{hook}-hook"] = (compressed.replace(COMPRESSED_HOOK, f'HOOK = "{hook}"'),
                               "(loss_fn(model(x), y) / k).backward()")
    return out


def _write(folder: Path, name: str, text: str) -> str:
    path = folder / name / "target.py"
    path.parent.mkdir()
    path.write_text(text)
    return str(path)


def _measure(session: Session, path: str) -> dict[str, Any]:
    record, _ = session.run_check(BY_ID["gradient-equivalence"], path)
    floor = record.evidence.get("noise_floor") or {}
    grads = floor.get("gradients") or {}
    return {"status": record.status, "observed": record.metrics.get("max_rel_grad_diff"),
            "floor": grads.get("floor_rel"), "bound": grads.get("judged_bound_rel"),
            "message": record.message}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sources = _sources()
    parser.add_argument("--configs", default=",".join(sources))
    args = parser.parse_args()
    names = [c for c in args.configs.split(",") if c]
    unknown = [c for c in names if c not in sources]
    if unknown:
        parser.error(f"--configs {unknown} are not among {sorted(sources)}")
    session = Session(Settings(backend="gloo", world_size=2, deadline=120.0))
    correct_max, bug_min = 0.0, float("inf")
    try:
        with tempfile.TemporaryDirectory(prefix="noise-floor-") as tmp:
            folder = Path(tmp)
            print(f"{'config':<15} {'floor':>9} {'bound':>9} {'correct':>9} {'ddp/floor':>9} "
                  f"{'bug 1/N':>9}  verdicts")
            for name in names:
                text, line = sources[name]
                assert text.count(line) == 1, f"{name}: {line!r} occurs {text.count(line)} times"
                bug_text = text.replace(line, line.replace("/ ", "/ torch.distributed.get_world_size() / ", 1))
                good = _measure(session, _write(folder, name, text))
                bad = _measure(session, _write(folder, f"{name}-bug", bug_text))
                correct_max = max(correct_max, good["observed"] or 0.0)
                bug_min = min(bug_min, bad["observed"] if bad["observed"] is not None else float("inf"))
                over = (good["observed"] or 0) / good["floor"] if good["floor"] else float("nan")
                print(f"{name:<15} {good['floor'] or 0:>9.2e} {good['bound'] or 0:>9.2e} "
                      f"{good['observed'] or 0:>9.2e} {over:>9.2f} {bad['observed'] or 0:>9.2e}  "
                      f"correct {good['status']}, bug {bad['status']}")
                if good["status"] != "passed" or bad["status"] != "failed":
                    print(f"  correct: {good['message'][:300]}\n  bug: {bad['message'][:300]}")
    finally:
        session.close()
    print(f"largest correct difference {correct_max:.3g}, smallest bug difference {bug_min:.3g}")
    print(f"ratio: {bug_min / correct_max:.0f}" if correct_max > 0 else "ratio: inf")


if __name__ == "__main__":
    main()
