"""A buffer DDP cannot broadcast into: the error named, the buffer found, the remedy re-run.

Contract (DDP docstring, ``broadcast_buffers``; ``forward_sync_buffers`` in torch 2.13): DDP
broadcasts rank 0's buffers to every rank at the start of every forward, with a coalesced
broadcast that copies the flat result back into each buffer. A buffer whose strides are not
those of a fresh tensor of its shape (``pe.unsqueeze(0).transpose(0, 1)``: shape (L, 1, D),
strides (D, L·D, 1) — "contiguous" to ``is_contiguous()``, which ignores a size-1 dimension's
stride) is refused as a destination: "unsupported operation: some elements of the input tensor
and the written-to tensor refer to a single memory location". The word-language-model
example's ``PositionalEncoding`` registers exactly such a buffer, and every check that trains
the model under DDP then raised that line, raw, with no cause.

When an equivalence check's DDP run raises it, :func:`name_buffer_overlap` probes the target on
the 1-rank world (its process group is up): every buffer of a freshly built model goes through
DDP's own ``_broadcast_coalesced`` alone, into a tensor with the buffer's strides, and the
buffers that raise are named with their shape and strides. ``forward_sync_buffers=False`` (no
broadcast at forward: right when no buffer changes during training) is re-run against the
single-process reference (``checkpointing.rerun``); building the buffer with plain strides
(``pe.unsqueeze(1)``, or ``.clone(memory_format=torch.contiguous_format)``) is the fix that
keeps buffers synchronised, suggested.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

from ddp_conformance.reports.keys import REMEDIES

from ...harness.context import CheckContext
from ...harness.outcome import Outcome
from ...harness.remedies import Rerun, suggested, to_json, verify
from ...harness.world import RankContext, RankFailure, WorldHang

#: DDP's (the coalesced broadcast's) error text for a destination it refuses (torch 2.13).
OVERLAP = "refer to a single memory location"
#: Evidence key of the probe's findings.
BUFFERS = "unbroadcastable_buffers"


def probe_buffers(rank_ctx: RankContext, spec: str) -> list[dict[str, Any]]:
    """Each buffer of a freshly built model through DDP's coalesced broadcast, alone, into a
    tensor with its strides (the model is not touched): the buffers that raise."""
    import torch
    import torch.distributed as dist

    from ...harness.ddp import MODEL_SEED, build_model
    from ...harness.targets import load_target

    model = build_model(load_target(spec), rank_ctx.device, seed=MODEL_SEED)
    group = dist.group.WORLD
    assert group is not None, "the 1-rank world initialises its process group"
    refused = []
    for name, buf in model.named_buffers():
        if buf is None or buf.numel() == 0:
            continue
        twin = torch.empty_strided(buf.size(), buf.stride(), dtype=buf.dtype, device=buf.device)
        try:
            dist._broadcast_coalesced(group, [twin], 1 << 20, 0)
        except RuntimeError as exc:
            refused.append({"name": name, "shape": list(buf.shape), "strides": list(buf.stride()),
                            "plain_strides": list(torch.empty(buf.shape).stride()),
                            "error": str(exc).splitlines()[0][:200]})
    return refused


def name_buffer_overlap(ctx: CheckContext, exc: Exception, outcome: Outcome, *,
                        rerun: Callable[..., Rerun]) -> Outcome:
    """``outcome`` with the buffer named and ``forward_sync_buffers=False`` re-run (``rerun``:
    the failing step again with DDP overrides, ``checkpointing.rerun``), when the DDP run
    raised the overlap error and the probe finds a buffer DDP's broadcast refuses; otherwise
    ``outcome`` unchanged (no cause without a measurement)."""
    if not isinstance(exc, RankFailure) or not any(
            r.error is not None and OVERLAP in r.error.describe() for r in exc.results):
        return outcome
    try:
        refused = ctx.world(world_size=1).run(probe_buffers, ctx.target.spec, deadline=ctx.deadline)[0].value
    except (RankFailure, WorldHang) as probe_error:
        return replace(outcome, evidence={**outcome.evidence, BUFFERS: {"probe_error": probe_error.headline()}})
    if not refused:
        return replace(outcome, evidence={**outcome.evidence, BUFFERS: []})
    remedy = verify("forward_sync_buffers=False",
                    partial(rerun, ctx, overrides={"forward_sync_buffers": False}, nonreentrant=False))
    plain = suggested("buffers with plain strides",
                      "needs the target's source changed: build the buffer in its final shape")
    listed = "; ".join(f"{b['name']} (shape {tuple(b['shape'])}, strides {tuple(b['strides'])}, plain "
                       f"{tuple(b['plain_strides'])})" for b in refused[:4])
    ev = remedy.evidence
    rerun_text = remedy.describe(
        f"{ev.get('steps')} steps completed on {ev.get('ranks')} ranks and match the single-process "
        f"reference" if remedy.verified else
        f"{ev.get('error') or ev.get('differ_from_reference') or ev.get('reason')}")
    message = (f"DDP cannot broadcast into buffer {listed}: at every forward DDP broadcasts rank 0's "
               f"buffers (forward_sync_buffers/broadcast_buffers=True) and its coalesced copy refuses a "
               f"destination whose strides are not a fresh tensor's (\"...{OVERLAP}\"; measured: each "
               f"buffer through DDP's broadcast alone); re-run with {rerun_text}")
    first = refused[0]["name"]
    recommendation = (f"register {first} with plain strides: build it in its final shape (e.g. "
                      f"pe.unsqueeze(1) rather than pe.unsqueeze(0).transpose(0, 1)) or "
                      f"clone(memory_format=torch.contiguous_format) it before register_buffer"
                      + ("; or, when no buffer changes during training, forward_sync_buffers=False "
                         "(verified here)" if remedy.verified else ""))
    return Outcome.failed(message, metrics={**outcome.metrics, "key_figure": f"buffer {first} not broadcastable"},
                          evidence={**outcome.evidence, BUFFERS: refused, REMEDIES: to_json([remedy, plain])},
                          recommendation=recommendation)
