"""Evaluation's own probes of one ``evaluate`` call (``harness.observe.Probe``); none of them
changes the user's code.

Each attaches itself to the DDP model it was given, observes, and returns its own typed slice
of the rank's record (``records``); the rank function hands them, with the shared probes (the
sample indices the DataLoaders fetched, the collectives called: ``harness.observe``), to one
``Observation`` (``rank.evaluate_on_rank``).
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from typing import Any

from ...harness.ddp import tensor_digest, unwrap
from ...harness.observe import Probe, SamplesSlice, unseen
from .records import BufferPart, BufferSlice, ForwardPart, ForwardSlice, ShardReadPart


def _mode_dependent(module: Any) -> bool:
    from torch import nn

    kinds = (nn.modules.batchnorm._BatchNorm, nn.modules.dropout._DropoutNd, nn.modules.instancenorm._InstanceNorm)
    return isinstance(module, kinds)


def _rows(args: tuple[Any, ...], kwargs: dict[str, Any], dim: int = 0) -> int:
    import torch

    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[dim if -value.dim() <= dim < value.dim() else 0])
    return 0


class Forward(Probe):
    """A forward pre-hook on the inner module (reached through DDP or around it): calls, rows,
    autograd on or off, modules in train mode; and the parameters' gradients before and after."""

    def __init__(self, model: Any, *, dim: int = 0) -> None:
        self.dim = dim  # the batch dimension of a forward's first tensor (``batches.first_dim``)
        self.calls = self.rows = self.grad_enabled = 0
        self.train_mode: dict[str, None] = {}
        self._module: Any = unwrap(model)
        self._had_grad: set[str] = set()
        self._watched: list[tuple[str, Any]] = []

    def attach(self, stack: contextlib.ExitStack) -> None:
        self._had_grad = {n for n, p in self._module.named_parameters() if p.grad is not None}
        # Found once: a forward then reads only these modules' flags, not the whole tree.
        self._watched = [(n or type(m).__name__, m) for n, m in self._module.named_modules() if _mode_dependent(m)]
        stack.callback(self._module.register_forward_pre_hook(unseen(self._seen), with_kwargs=True).remove)

    def _seen(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        import torch

        self.calls += 1
        self.rows += _rows(args, kwargs, self.dim)
        self.grad_enabled += torch.is_grad_enabled()
        for name, sub in self._watched:
            if sub.training:
                self.train_mode.setdefault(name)

    def result(self) -> ForwardPart:
        written = tuple(n for n, p in self._module.named_parameters()
                        if p.grad is not None and n not in self._had_grad)
        return ForwardPart(forward=ForwardSlice(self.calls, self.rows, self.grad_enabled, tuple(self.train_mode),
                                                written))


class Buffers(Probe):
    """Digests of every buffer before and after ``evaluate``: BatchNorm's running statistics
    (and ``num_batches_tracked``) change only when a forward ran in train mode."""

    def __init__(self, model: Any) -> None:
        self._module: Any = unwrap(model)
        self._before: dict[str, str] = {}

    def attach(self, stack: contextlib.ExitStack) -> None:
        self._before = {n: tensor_digest(b) for n, b in self._module.named_buffers()}

    def result(self) -> BufferPart:
        after = {n: tensor_digest(b) for n, b in self._module.named_buffers()}
        changed = tuple(n for n, d in after.items() if self._before.get(n) != d)
        return BufferPart(buffers=BufferSlice(len(after), changed))


class ShardReads(Probe):
    """``DTensor.to_local()`` called on a sharded parameter of the model during ``evaluate`` by
    code outside torch (the target's): this rank's slice read where one process holds the whole
    parameter (a weight norm, a head applied by hand). FSDP2's own forward reads shards through
    torch's frames, which are not counted. Nothing to watch on a model without sharded DTensors."""

    def __init__(self, model: Any) -> None:
        self._names = {id(p): n for n, p in unwrap(model).named_parameters()
                       if not all(pl.is_replicate() for pl in getattr(p, "placements", None) or [_Whole()])}
        self._read: dict[str, None] = {}

    def attach(self, stack: contextlib.ExitStack) -> None:
        if not self._names:
            return
        from torch.distributed.tensor import DTensor

        from ...harness.patching import replaced

        stack.enter_context(replaced(DTensor, "to_local", self._watching))

    def _watching(self, original: Any) -> Any:
        import sys

        names, read = self._names, self._read
        torch_dir = f"{os.sep}torch{os.sep}"

        def to_local(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            name = names.get(id(tensor))
            if name is not None and torch_dir not in sys._getframe(1).f_code.co_filename:
                read.setdefault(name)
            return original(tensor, *args, **kwargs)

        return to_local

    def result(self) -> ShardReadPart:
        return ShardReadPart(shard_reads=tuple(self._read))


class _Whole:
    """The placement of a plain tensor: whole on this rank."""

    @staticmethod
    def is_replicate() -> bool:
        return True


def index_counts(samples: list[SamplesSlice]) -> dict[str, Counter[int]]:
    """Per dataset key, how many times each index was fetched over the given ranks' slices."""
    out: dict[str, Counter[int]] = {}
    for s in samples:
        for key, indices in s.indices.items():
            out.setdefault(key, Counter()).update(indices)
    return out
