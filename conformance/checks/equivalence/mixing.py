"""Does the model mix samples: do a sample's outputs depend on the other samples of its batch?

A statistic over the batch computed outside BatchNorm — a minibatch standard deviation
(StyleGAN's discriminator concatenates the std over groups of ``min(batch, 4)`` samples as a
feature), a batch-wide softmax, a mean subtracted over the batch — makes each sample's output
depend on the samples it shares a forward with. Each rank computes it over its own B/N samples
and one process over B: the N-rank step is *by design* not the large-batch step, and the
gradients differ whatever DDP does. BatchNorm is the same in kind and has its own handling
(``normalisation``, ``batch_layout``): a BatchNorm found first is left to it.

Measured, not assumed: the same input batch goes through the model whole and in its parts (the
pieces the comparison uses), and every module call's floating inputs and outputs whose batch
dimension has the call's batch size are fingerprinted row by row (``row_prints``: two random
projections and the norm of each sample's row, float64, on the host: a few numbers per sample,
never the activation). The parts' rows are held to the whole's rows of the same samples
(``first_mixing``); the first call in forward order where most rows moved beyond rounding names
the module, or the forward that computed that module's inputs. The probe runs in forwards the
suite already makes (``hypotheses.loss_split``'s, the shared-weights reference's and ranks'):
no forward of its own.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from .leaves import floating_tensors

#: Seed of the projection vectors: the same on every side (the whole run and each part's).
SEED = 20261207
#: Random projections per row: one may happen to be nearly orthogonal to a change.
PROJECTIONS = 2
#: How far a sample's row may move, relative to its norm, when the only difference is the
#: batch size it went through: (beyond any doubt, beyond one layer's rounding). The same rows
#: through a matmul (or a convolution) at another batch size differ by rounding only: another
#: kernel, blocking or accumulation order rounds each dot product of n terms to ~sqrt(n)·u of
#: its size (u: the unit roundoff, 6e-8 in fp32), and a module's inputs carry what every module
#: before it rounded: ~L·sqrt(n)·u after L layers — 2e-5 for n = 1e4, L = 10. The first figure,
#: 1e-3 in fp32, leaves a factor of 50 over that for deeper models and a Winograd or FFT
#: convolution picked anew on a GPU. A batch statistic moves a row by its share of the row: a
#: BatchNorm-like normalisation moves every element (O(1)), but StyleGAN's minibatch-std channel
#: is 16 of the 8,208 numbers of a sample's row at 8x8 and moves it by 2e-5..1e-3 (measured on
#: rosinality/stylegan2-pytorch's Discriminator) — under the first figure. So a row also counts
#: as moved beyond the second figure (one layer's rounding, sqrt(1e4)·u ≈ 6e-6 in fp32, measured
#: 1e-15 on CPU, where the same rows come out bit for bit or nearly) when it is ``JUMP`` times
#: beyond every earlier call's largest move: rounding grows layer by layer, a batch statistic
#: appears at once. In half precision u is 4e-3 (bf16) or 5e-4 (fp16), and one rounding
#: already reaches 1e-2: one figure, 5e-2.
TOLERANCE = {"torch.float64": (1e-9, 1e-12), "torch.float32": (1e-3, 1e-5),
             "torch.bfloat16": (5e-2, 5e-2), "torch.float16": (5e-2, 5e-2)}
#: How far beyond every earlier call's largest move a move must jump to count past the second
#: figure of ``TOLERANCE``.
JUMP = 100.0
#: The share of a call's rows that must move: a batch statistic moves every sample's row, while
#: a discrete choice that rounding tipped (a top-k near tie, ``routing``) moves the few rows it
#: touches.
SHARE = 0.5
#: A row whose norm is below this share of the call's largest is held to that floor instead
#: (a ReLU's all-zero row would count its rounding as a change).
NEGLIGIBLE = 1e-2

#: One module call's fingerprints: (kind "input" | "output", module name, its class, the module
#: whose forward called it ("" the root, None outside the model), whether it is a BatchNorm, per
#: tensor (projections [rows, PROJECTIONS], norms [rows], a row's width, ``TOLERANCE``)). Plain
#: tuples and tensors: ``torch.save`` with ``weights_only`` carries them to another process.
Call = tuple[str, str, str, "str | None", bool, list[tuple[Any, Any, int, tuple[float, float]]]]




@contextlib.contextmanager
def row_prints(model: Any, *, rows: int, dim: int = 0) -> Iterator[list[Call]]:
    """Every module call of ``model`` inside the block, in forward order (inputs when the call
    starts, outputs when it ends), its floating tensors with ``rows`` samples along ``dim`` (the
    target's ``batch_dim`` for its inputs) fingerprinted per sample. Observation only: the hooks
    return nothing and are removed on exit."""
    import torch
    from torch import nn

    calls: list[Call] = []
    vectors: dict[tuple[int, str], Any] = {}
    stack: list[str] = []
    # The widest tolerance of any tensor so far: an fp32 tensor computed from bf16 ones (autocast
    # runs LayerNorm and softmax in fp32) carries their rounding.
    noisiest = [TOLERANCE["torch.float64"]]

    # A module's output is usually the next one's input, the same tensor: fingerprinted once (the
    # weak reference tells a live tensor from a freed one whose id came back).
    done: dict[tuple[int, int], tuple[Any, Any, Any, int]] = {}

    def fingerprint(t: Any, d: int) -> tuple[Any, Any, int]:
        key = (id(t), t._version)
        if key in done and done[key][0]() is t:
            return done[key][1:]
        flat = t.detach().movedim(d, 0).reshape(rows, -1).double()
        width = (flat.shape[1], str(flat.device))
        if width not in vectors:
            g = torch.Generator().manual_seed(SEED + flat.shape[1])
            vectors[width] = torch.randn(flat.shape[1], PROJECTIONS, generator=g,
                                         dtype=torch.float64).to(flat.device)
        found = ((flat @ vectors[width]).cpu(), flat.norm(dim=1).cpu(), flat.shape[1])
        done[key] = (weakref.ref(t), *found)
        return found

    def prints(value: Any) -> list[tuple[Any, Any, int, tuple[float, float]]]:
        out = []
        for t in floating_tensors(value):
            d = dim % t.dim() if t.dim() else None
            if d is None or t.shape[d] != rows or not rows:
                continue
            own = TOLERANCE.get(str(t.dtype), TOLERANCE["torch.float32"])
            noisiest[0] = (max(own[0], noisiest[0][0]), max(own[1], noisiest[0][1]))
            out.append((*fingerprint(t, d), noisiest[0]))
        return out

    def before(name: str, module: Any, args: Any, kwargs: Any) -> None:
        calls.append(("input", name, type(module).__name__, stack[-1] if stack else None,
                      isinstance(module, nn.modules.batchnorm._BatchNorm), prints((args, kwargs))))
        stack.append(name)

    def after(name: str, module: Any, args: Any, output: Any) -> None:
        if stack:
            stack.pop()
        calls.append(("output", name, type(module).__name__, stack[-1] if stack else None,
                      isinstance(module, nn.modules.batchnorm._BatchNorm), prints(output)))

    handles = []
    for name, module in model.named_modules():
        handles.append(module.register_forward_pre_hook(
            lambda m, a, k, name=name: before(name, m, a, k), with_kwargs=True))
        handles.append(module.register_forward_hook(lambda m, a, o, name=name: after(name, m, a, o)))
    try:
        yield calls
    finally:
        for handle in handles:
            handle.remove()


@dataclass(frozen=True, slots=True)
class Mixing:
    """Where a sample's values first depended on the other samples of its batch."""

    module: str  # the module whose outputs (or inputs) moved
    kind: str  # "output": the module itself mixes; "input": the forward that called it did
    cls: str
    caller: str | None  # the module whose forward computed those inputs ("": the model's own)
    caller_cls: str | None
    rows: int  # rows compared at that call
    moved: int  # of which moved beyond rounding
    worst: float  # the largest move relative to its row's norm
    tolerance: float

    def where(self) -> str:
        """The module (or forward) named, in words."""
        if self.kind == "output":
            return f"the outputs of module {self.module!r} ({self.cls})"
        caller = ("the model's own forward" if self.caller == "" else
                  f"the forward of module {self.caller!r}" if self.caller else "the loss code")
        return (f"the inputs of module {self.module!r} ({self.cls}), computed in {caller}"
                + (f" ({self.caller_cls})" if self.caller_cls else "") + ",")

    def cause(self, *, world_size: int) -> str:
        """The cause, named: the N-rank step cannot equal the large-batch step by design."""
        return (f"{self.where()} for a sample depend on the other samples of its batch (a batch "
                f"statistic outside BatchNorm, e.g. a minibatch standard deviation; {self.moved} of "
                f"{self.rows} samples moved by up to {self.worst:.2g} of their norm, rounding allows "
                f"{self.tolerance:g}, the same batch run whole and in parts): each rank computes it "
                f"over its own B/{world_size} samples, one process over B, so the {world_size}-rank "
                f"step cannot equal the large-batch step by design")

    def to_json(self) -> dict[str, Any]:
        return {"module": self.module, "kind": self.kind, "class": self.cls, "caller": self.caller,
                "caller_class": self.caller_cls, "rows": self.rows, "moved": self.moved,
                "worst_rel": self.worst, "tolerance": self.tolerance}

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> Mixing:
        return cls(value["module"], value["kind"], value["class"], value["caller"], value["caller_class"],
                   int(value["rows"]), int(value["moved"]), float(value["worst_rel"]), float(value["tolerance"]))


#: What to do when the model mixes samples (the recommendation of every check that names it).
ADVICE = ("compare what can be equal: keep the statistic per GPU in production too (as DDP computes "
          "it), and give the checks a target variant that computes it over fixed groups of "
          "contiguous samples whose size divides the microbatch (StyleGAN's std over "
          "x.view(-1, group, C, H, W) instead of x.view(group, -1, C, H, W)), so one process forms "
          "the same groups as the ranks and the steps compare exactly "
          "(tests/targets/minibatch_std_fixed_groups.py); or make the statistic global with an "
          "all-reduce over the ranks, as SyncBatchNorm does for BatchNorm")


def first_mixing(whole: Sequence[Call], parts: Sequence[tuple[int, Sequence[Call]]]) -> Mixing | None:
    """The first call (forward order) where most of the parts' rows moved from the whole run's
    rows of the same samples beyond their dtype's rounding (``TOLERANCE``); None when none did,
    or when the first is a BatchNorm's own output (``normalisation`` and ``batch_layout`` own
    that). ``parts``: (the part's first row in the whole batch, its calls).

    The calls are matched by position while each side has the same module at the same position
    and the same number of batched tensors; comparing stops at the first call that does not
    match (a forward that branches on the batch size), with what was compared so far."""
    import torch

    seen = 0.0  # the largest move of every earlier call: the rounding so far
    for index, (kind, name, cls, caller, batchnorm, tensors) in enumerate(whole):
        moved = total = 0
        worst, tolerance = 0.0, 0.0
        for start, calls in parts:
            if index >= len(calls) or calls[index][:2] != (kind, name) or len(calls[index][5]) != len(tensors):
                return None
            for (wp, wn, width, (certain, rounding)), (pp, pn, part_width, _) in zip(tensors, calls[index][5]):
                n = pp.shape[0]
                if start + n > wp.shape[0] or width != part_width:
                    return None  # not the same samples' rows (a B x B logits matrix): no comparison
                ref_p, ref_n = wp[start:start + n], wn[start:start + n]
                scale = torch.clamp(ref_n, min=NEGLIGIBLE * float(wn.max()) if wn.numel() else 0.0)
                scale = torch.where(scale > 0, scale, torch.ones_like(scale))
                change = torch.maximum((pp - ref_p).abs().amax(1), (pn - ref_n).abs()) / scale
                limit = min(certain, max(rounding, JUMP * seen))
                moved += int((change > limit).sum())
                total += n
                worst, tolerance = max(worst, float(change.max()) if n else 0.0), max(tolerance, limit)
        if total and moved and moved >= SHARE * total:
            if kind == "output" and batchnorm:
                return None  # BatchNorm's own statistics: ``normalisation`` and ``batch_layout``
            caller_cls = next((c[2] for c in whole if c[1] == caller), None) if caller is not None else None
            return Mixing(name, kind, cls, caller, caller_cls, total, moved, worst, tolerance)
        seen = max(seen, worst)
    return None
