"""Discontinuous models: top-k routing decisions recorded on both sides, and where they part.

A mixture-of-experts layer sends each token to the ``k`` experts with the largest gate scores
(``torch.topk``). The choice is a discontinuity: a token whose k-th and (k+1)-th scores are
within a last bit of each other goes to another expert when the sums before the gate are done
in another order — as they are under DDP (each rank reduces its shard, then the all-reduce) and
in one process (the whole batch). From the step where a decision differs, the two runs
legitimately part by far more than rounding (measured: a frozen near-tied router, 27 of 256
tokens on another expert one step after the layers before it moved by last bits; parameters
then 0.03 apart), and neither the fixed tolerances nor a twin's floor describe that: a twin
whose own routing flipped measures the flip, not rounding.

So every ``topk`` call of the recorded run is observed (``RoutingProbe``: ``torch.topk`` and
``Tensor.topk`` wrapped while the step runs, as ``ClipProbe`` wraps clipping) and its indices
kept per step, rows (tokens) by k choices. The supervisor lays each side's calls out in the
reference's row order — rank by rank, forward by forward, in the N-rank run's contiguous
shards, each call's rows first put sample by sample as the probe saw them (``batch_layout``:
a router fed sequence-major tokens, Megatron's ``[s, b, h]`` flattened, holds every sample's
first token, then every second...) — and compares the *sets* of chosen indices row by row
(``first_flip``). Then:

- the twin's parameters from its first flipped step on are no measurement of noise: its floor
  is taken over the steps before (``trim_twin``), and a twin that flipped at its first compared
  step measures no floor at all;
- a mismatch without a measured cause, where the N-rank run's routing differs from the
  reference's, is **inconclusive**, saying at which step how many tokens chose another expert
  and what was compared before it — never a failure that names no cause. A measured cause (a
  gradient factor of N at the first step, before any flip) still fails.

Calls whose layout does not map onto the reference's (another number of calls, rows that do
not split) are "not compared", said in the record. ``topk`` outside the model (a top-5 accuracy
in the step) is recorded too: its indices only differ where the logits' order flips.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

#: Indices kept per step and rank at most (a large model's every token and layer would be
#: megabytes per step on the supervisor's pipe); past it the step's routing is "not recorded".
MAX_INDICES = 1 << 20

Call = tuple[int, int, bytes]  # (rows, k, int64 indices row-major)
#: The twin's record key saying why it measures no noise (``floor.twin_floor`` reads it).
NOT_NOISE = "not_noise"


@dataclass
class RoutingProbe:
    """``torch.topk`` and ``Tensor.topk`` observed while a step runs: the indices they return."""

    calls: list[Call] = field(default_factory=list)
    size: int = 0
    overflow: bool = False

    @classmethod
    @contextlib.contextmanager
    def watching(cls) -> Iterator[RoutingProbe]:
        import torch

        probe = cls()
        function, method = torch.topk, torch.Tensor.topk

        def record(out: Any) -> Any:
            # Inside a graph dynamo traces, record nothing: a host copy there would break the
            # user's graph (a compiled side's calls then do not map: "not compared").
            if torch.compiler.is_compiling():
                return out
            indices = out[1].detach()
            if indices.dim() == 0 or probe.overflow:
                return out
            k = indices.shape[-1] if indices.dim() else 1
            probe.size += indices.numel()
            if probe.size > MAX_INDICES:
                probe.overflow = True
                probe.calls = []
                return out
            flat = indices.reshape(-1, k).to("cpu", torch.int64).contiguous()
            probe.calls.append((int(flat.shape[0]), int(k), flat.numpy().tobytes()))
            return out

        def topk(*args: Any, **kwargs: Any) -> Any:
            return record(function(*args, **kwargs))

        def tensor_topk(self: Any, *args: Any, **kwargs: Any) -> Any:
            return record(method(self, *args, **kwargs))

        torch.topk = topk
        torch.Tensor.topk = tensor_topk  # type: ignore[method-assign]
        try:
            yield probe
        finally:
            torch.topk = function
            torch.Tensor.topk = method  # type: ignore[method-assign]

    def take(self) -> list[Call] | None:
        """This step's calls (None: more indices than MAX_INDICES, not recorded)."""
        calls = None if self.overflow else self.calls
        self.calls, self.size, self.overflow = [], 0, False
        return calls


@dataclass(frozen=True, slots=True)
class Flip:
    """The first step at which a side's routing decisions differ from the reference's."""

    step: int
    tokens: int  # rows (tokens) whose set of chosen indices differs, over the step's calls
    rows: int  # rows compared at that step
    calls: int  # topk calls per step in the reference

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "tokens_routed_elsewhere": self.tokens, "tokens_compared": self.rows,
                "topk_calls_per_step": self.calls}


def _rows(calls: list[Call]) -> Any:
    import numpy as np

    parts = [np.frombuffer(data, dtype=np.int64).reshape(rows, k) for rows, k, data in calls]
    if not parts or len({p.shape[1] for p in parts}) != 1:
        return None
    return np.concatenate(parts)


def _canonical(rows: Any, layout: dict[str, Any] | None) -> Any:
    """One call's rows with each sample's rows adjacent (``batch_layout``: a router fed
    sequence-major tokens, ``[s, b, h]`` flattened, sees every sample's first token, then every
    second...); None where its rows were seen not to map onto samples."""
    if layout is None:
        return rows
    if "unmapped" in layout:
        return rows if str(layout["unmapped"]).startswith("not observed") else None
    per = int(layout["rows_per_sample"])
    if layout["arrangement"] == "sample-major" or per == 1:
        return rows
    if len(rows) % per:
        return None
    return rows.reshape(per, len(rows) // per, -1).transpose(1, 0, 2).reshape(len(rows), -1)


def _layout(side: list[list[Call]], layers: int, blocks_reversed: int,
            layouts: list[list[dict[str, Any]]] | None = None) -> list[Any] | None:
    """Each rank's calls of one step in the reference's row order, per reference call:
    ``layouts`` (per rank, per call of one loss) says which of a call's rows are which samples."""
    import numpy as np

    out = []
    for layer in range(layers):
        parts = []
        for rank, calls in enumerate(side):
            if len(calls) % layers:
                return None
            mine = (layouts or [])[rank] if rank < len(layouts or []) else []
            pieces = [_canonical(_rows([c]), mine[layer] if len(mine) == layers else None)
                      for c in calls[layer::layers]]
            if any(r is None for r in pieces) or len({r.shape[1] for r in pieces}) != 1:
                return None
            rows = np.concatenate(pieces)
            if blocks_reversed > 1:
                if len(rows) % blocks_reversed:
                    return None
                rows = np.concatenate(np.split(rows, blocks_reversed)[::-1])
            parts.append(rows)
        out.append(np.concatenate(parts))
    return out


def first_flip(reference: dict[str, Any], side: list[dict[str, Any]], *,
               blocks_reversed: int = 0) -> tuple[Flip | None, str]:
    """(the first step whose decisions differ, or None; what was compared). ``side``: the
    N-rank run's values (rank order) or the twin's (one); ``blocks_reversed``: the twin ran its
    microbatches in reverse order, this many of them."""
    import numpy as np

    ref_steps: list[list[Call] | None] = reference.get("routing") or []
    if not any(ref_steps):
        return None, "no top-k call in the reference's step"
    compared = 0
    for step, ref_calls in enumerate(ref_steps):
        mine = [(v.get("routing") or [None] * (step + 1))[step] if len(v.get("routing") or []) > step
                else None for v in side]
        if not ref_calls or any(m is None for m in mine):
            continue
        laid = _layout([m for m in mine if m is not None], len(ref_calls), blocks_reversed,
                       [v.get("routing_layouts") or [] for v in side])
        ref_layouts = reference.get("routing_layouts") or []
        if laid is None:
            return None, (f"top-k calls of step {step} do not map onto the reference's "
                          f"({len(ref_calls)} per step there): not compared")
        differ = rows = 0
        for layer, (ref_call, got) in enumerate(zip(ref_calls, laid)):
            ref_rows = _rows([ref_call])
            if ref_rows is not None and len(ref_layouts) == len(ref_calls):
                ref_rows = _canonical(ref_rows, ref_layouts[layer])
            if ref_rows is None or ref_rows.shape != got.shape:
                return None, f"top-k call shapes of step {step} differ from the reference's: not compared"
            differ += int((np.sort(ref_rows, axis=1) != np.sort(got, axis=1)).any(axis=1).sum())
            rows += len(got)
        compared += 1
        if differ:
            return Flip(step, differ, rows, len(ref_calls)), f"{compared} step(s) compared"
    return None, f"{compared} step(s) of top-k decisions compared, all identical"


def trim_twin(reference: dict[str, Any], twin: dict[str, Any] | None, *,
              blocks_reversed: int = 0) -> tuple[dict[str, Any] | None, Flip | None]:
    """The twin with what its own routing flips made of it removed: parameters and gradient
    norms from its first flipped step on; everything when it flipped at (or before) the compared gradients."""
    if twin is None or twin.get("failed"):
        return twin, None
    flip, _ = first_flip(reference, [twin], blocks_reversed=blocks_reversed)
    if flip is None:
        return twin, None
    if flip.step <= int(reference.get("grads0_step") or 0):
        return {**twin, NOT_NOISE: (f"the run on its microbatches sent {flip.tokens} of {flip.rows} "
                                    f"tokens to other experts than the whole-batch run at step "
                                    f"{flip.step} (top-k routing): it measures a flip, not rounding")}, flip
    return {**twin, "params": (twin.get("params") or [])[:flip.step],
            "grad_norms": (twin.get("grad_norms") or [])[:flip.step]}, flip


def explains(flip: Flip | None, *, grads0_step: int, before_ok: bool) -> bool:
    """Does the routing flip account for the mismatch? Yes when it comes at or before the first
    compared step (nothing was compared under the same routing), or when everything compared
    before it (``before_ok``: the first-step gradients, the parameters of earlier steps) matched."""
    if flip is None:
        return False
    return flip.step <= grads0_step or before_ok


def flip_message(flip: Flip, *, grads0_step: int) -> str:
    """Why a mismatch without a measured cause is no finding: the routing parted."""
    before = ("the first-step gradients and the parameters after the steps before it were "
              "compared under the same routing" if flip.step > grads0_step else
              "nothing was compared under the same routing (it differs in the first step)")
    return (f"the top-k routing differs from the single-process reference's from step {flip.step} "
            f"on: {flip.tokens} of {flip.rows} tokens chose other experts under DDP (decisions "
            f"within a last bit of a tie, decided by the summation order); from there the runs "
            f"legitimately part, and {before}")
