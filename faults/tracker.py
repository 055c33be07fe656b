"""The suite's own collective flight recorder: last enqueued vs last completed, per rank.

PyTorch's flight recorder covers NCCL (``_dump_nccl_trace_json``) and, on torch 2.13, gloo too
(``_dump_fr_trace_json``), but only in the rank's own memory: a rank that died, froze or was
killed by the supervisor takes its record along (the ranks that still answer hand theirs back,
see ``faults._flight``). So every rank also writes one JSON line when it *enqueues* a
collective and one when it *completes*, into a file outside the world's scratch directory
(which dies with the world). Lines are flushed as written, so the record survives
``os._exit``, SIGKILL and SIGSTOP.

The supervisor compares the ranks' sequences: a rank whose last enqueued collective is
behind its peers' never entered the collective (application divergence); every rank
enqueued but none completed means the transport is stuck; a collective whose (op, shape) or
tag differs across ranks at the same sequence number is a mispairing.
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any, Callable

from conformance.harness.parallel import COLLECTIVE_WORDS as OP_WORDS
from conformance.harness.parallel import FSDP2_ALL_GATHERS

from ._log import read_jsonl


def log_path(directory: str | Path, rank: int) -> Path:
    return Path(directory) / f"collectives-rank{rank}.jsonl"


class CollectiveTracker:
    """Sequence numbers and timings of this rank's collectives (DDP buckets or explicit)."""

    def __init__(self, rank: int, directory: str | Path | None = None) -> None:
        self.rank = rank
        self.seq = 0
        self.step = 0
        self.records: list[dict[str, Any]] = []  # in memory: timings for the straggler judge
        self._file = open(log_path(directory, rank), "a", buffering=1) if directory else None
        self._names: dict[int, str] = {}
        self._open: dict[int, float] = {}  # seq -> t_perf of collectives enqueued, not completed
        self._taps = contextlib.ExitStack()  # FSDP2's collectives, tapped (``attach``)
        self.fsdp2 = False  # an FSDP2 model attached: its collectives are recorded by name

    def name_parameters(self, module: Any) -> None:
        self._names = {p.data_ptr(): n for n, p in module.named_parameters()}

    def _write(self, line: dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write(json.dumps(line) + "\n")

    def enqueue(self, op: str, shape: tuple[int, ...], *, tag: str, bucket: int | None = None,
                params: list[str] | None = None) -> int:
        self.seq += 1
        line: dict[str, Any] = {"event": "enqueued", "seq": self.seq, "op": op, "shape": list(shape), "tag": tag,
                "step": self.step, "bucket": bucket, "params": params or [], "t": time.time(),
                "t_perf": time.perf_counter()}
        self.records.append(line)
        self._open[self.seq] = line["t_perf"]
        self._write(line)
        return self.seq

    def complete(self, seq: int) -> None:
        line = {"event": "completed", "seq": seq, "t": time.time(), "t_perf": time.perf_counter()}
        self.records.append(line)
        self._open.pop(seq, None)
        self._write(line)

    def oldest_open(self) -> tuple[int, float] | None:
        """(seq, perf_counter at enqueue) of the oldest collective still in flight, if any.

        Read from another thread (the flight-recorder snapshot): single dict operations are
        atomic under the GIL, and a copy is taken before looking at it.
        """
        items = list(self._open.items())
        return min(items, key=lambda kv: kv[1]) if items else None

    def all_reduce(self, tensor: Any, *, tag: str, group: Any = None,
                   on_issue: Callable[[], None] | None = None) -> Any:
        """An explicit all-reduce, recorded before it is issued and after it returns.

        ``on_issue`` runs between the two: after the enqueue line is on disk, as the rank hands
        the collective to the backend -- where an injected transport stall freezes the rank.
        """
        import torch.distributed as dist

        seq = self.enqueue("all_reduce", tuple(tensor.shape), tag=tag)
        if on_issue is not None:
            on_issue()
        dist.all_reduce(tensor, group=group)
        self.complete(seq)
        return tensor

    def attach(self, ddp_model: Any, group: Any = None) -> Any:
        """Record every bucket all-reduce of ``ddp_model`` (a layer of its comm hook chain);
        the all-reduces run in the DDP model's own process group, ``group`` (kept for callers)."""
        from conformance.harness.comm_hooks import add_layer
        from conformance.harness.parallel import is_fsdp2

        # The composable replicate and fully_shard change the module in place: no ``.module``.
        self.name_parameters(getattr(ddp_model, "module", ddp_model))
        if is_fsdp2(ddp_model):
            # FSDP2 has no comm hook: its all-gathers (before each group's forward and backward)
            # and reductions are Python collectives, recorded through the collectives probe's
            # taps (closed with the tracker); a rank that skips a forward is then found at the
            # all-gather its peers wait in, not only at the next reduction.
            from conformance.harness.observe import tap
            from conformance.harness.observe.comm_rounds import FSDP2_REDUCTIONS

            if not self.fsdp2:
                tap(self._taps, self._collective, (*FSDP2_ALL_GATHERS, *FSDP2_REDUCTIONS))
            self.fsdp2 = True
            return ddp_model
        # A layer of the model's one comm hook chain, not a hook of its own: a hook the target
        # registered in configure_ddp still reduces the bucket (DDP takes one hook only).
        add_layer(ddp_model, self.layer)
        return ddp_model

    def issued(self) -> dict[str, int]:
        """The collectives this rank enqueued: ``allreduces``, every gradient reduction (DDP's
        bucket all-reduces; FSDP2's reduce-scatters and all-reduces), and with an FSDP2 model
        attached, one count per kind in :data:`OP_WORDS`' words (``"all-gathers": 24``, ...)."""
        ops = [r["op"] for r in self.records if r["event"] == "enqueued"]
        counts = {"allreduces": sum(op not in FSDP2_ALL_GATHERS for op in ops)}
        if self.fsdp2:
            for op in ops:
                counts[OP_WORDS.get(op, op)] = counts.get(OP_WORDS.get(op, op), 0) + 1
        return counts

    def _collective(self, called: Any, proceed: Callable[[], Any]) -> Any:
        """Record one FSDP2 collective (all-gather, reduce-scatter or all-reduce) around its
        issue."""
        first = next((a for a in [*called.args, *called.kwargs.values()] if hasattr(a, "shape")), None)
        seq = self.enqueue(called.name, tuple(first.shape) if first is not None else (),
                           tag=f"step{self.step}/{called.name}")
        result = proceed()
        self.complete(seq)
        return result

    def layer(self, bucket: Any, reduce: Callable[[Any], Any]) -> Any:
        """Record one bucket all-reduce around ``reduce`` (the rest of the hook chain)."""
        params = [self._names.get(p.data_ptr(), "?") for p in bucket.parameters()]
        seq = self.enqueue("all_reduce", tuple(bucket.buffer().shape), tag=f"step{self.step}/bucket{bucket.index()}",
                           bucket=bucket.index(), params=params)

        def done(f: Any) -> Any:
            # value() first: it raises for a failed all-reduce, which must stay "not completed".
            reduced = f.value()
            self.complete(seq)
            return reduced

        return reduce(bucket).then(done)

    def close(self) -> None:
        self._taps.close()
        if self._file is not None:
            self._file.close()
            self._file = None


def read_logs(directory: str | Path, world_size: int) -> dict[int, list[dict[str, Any]]]:
    """Every rank's recorded lines (a rank that never wrote has an empty list)."""
    return {rank: read_jsonl(log_path(directory, rank)) for rank in range(world_size)}
