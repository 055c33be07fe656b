"""Rank-side observers of one ``evaluate`` call; none of them changes the user's code.

Each one attaches itself to the DDP model (or to the torch classes the evaluation goes
through), observes, and on ``detach()`` returns its own typed slice of the rank's record
(``records``). The rank function only iterates over them (``rank.evaluate_on_rank``).

Sample identity is by **index**, never by content: :class:`SampleIndices` wraps the
DataLoader iterator's ``_next_index`` (the one place every map-style loader, single- or
multi-process, asks its sampler for the next batch of indices, in the rank's own process) and
maps each index through ``Subset``s to the root dataset. An evaluation set may repeat content
legitimately (duplicate images, constant padding tokens), so a content hash would call them
duplicates; the DistributedSampler's padding, on the other hand, repeats *indices*, which is
exactly what is counted. Loaders over an IterableDataset have no index: their batches are
counted (``unindexed_batches``), and the forward's rows stand in for the sample count.
"""

from __future__ import annotations

import contextlib
import functools
from collections import Counter
from typing import Any, Callable, Protocol

from ...harness.ddp import tensor_digest, unwrap
from ...harness.patching import replaced as _replaced
from .records import (
    BufferSlice,
    CollectiveCall,
    CollectiveSlice,
    ForwardSlice,
    SamplerSeen,
    SamplesSlice,
    UnevenCollective,
)

#: Inputs of a collective up to this many elements have their values recorded: metrics, sums and
#: counts (what the cause analysis reads), never a model's worth of predictions.
SMALL_TENSOR = 64


class Instrument(Protocol):
    """What the rank function asks of an observer (issue 20 moves this into the engine)."""

    def attach(self, model: Any) -> None: ...

    def detach(self) -> Any: ...


class UnevenGather(RuntimeError):
    """Raised in place of a gather whose tensors differ in shape across ranks (``Collectives``)."""

    def __init__(self, found: UnevenCollective) -> None:
        shapes = ", ".join(f"rank {r} {list(s)}" for r, s in sorted(found.shapes.items()))
        super().__init__(f"{found.op} of tensors of different shapes across ranks: {shapes}")
        self.found = found


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


class Forward:
    """A forward pre-hook on the inner module (reached through DDP or around it): calls, rows,
    autograd on or off, modules in train mode; and the parameters' gradients before and after."""

    def __init__(self, *, dim: int = 0) -> None:
        self.dim = dim  # the batch dimension of a forward's first tensor (``batches.first_dim``)
        self.calls = self.rows = self.grad_enabled = 0
        self.train_mode: dict[str, None] = {}
        self._handle: Any = None
        self._module: Any = None
        self._had_grad: set[str] = set()
        self._watched: list[tuple[str, Any]] = []

    def attach(self, model: Any) -> None:
        self._module = unwrap(model)
        self._had_grad = {n for n, p in self._module.named_parameters() if p.grad is not None}
        # Found once: a forward then reads only these modules' flags, not the whole tree.
        self._watched = [(n or type(m).__name__, m) for n, m in self._module.named_modules() if _mode_dependent(m)]
        self._handle = self._module.register_forward_pre_hook(self._seen, with_kwargs=True)

    def _seen(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        import torch

        self.calls += 1
        self.rows += _rows(args, kwargs, self.dim)
        self.grad_enabled += torch.is_grad_enabled()
        for name, sub in self._watched:
            if sub.training:
                self.train_mode.setdefault(name)

    def detach(self) -> ForwardSlice:
        self._handle.remove()
        written = tuple(n for n, p in self._module.named_parameters()
                        if p.grad is not None and n not in self._had_grad)
        return ForwardSlice(self.calls, self.rows, self.grad_enabled, tuple(self.train_mode), written)


def _root(dataset: Any, indices: list[int]) -> tuple[Any, list[int]]:
    """Indices of a (nested) ``Subset`` mapped to the dataset it is cut from."""
    from torch.utils.data import Subset

    while isinstance(dataset, Subset):
        indices = [int(dataset.indices[i]) for i in indices]
        dataset = dataset.dataset
    return dataset, indices


def _key(dataset: Any) -> str:
    try:
        size: Any = len(dataset)
    except TypeError:
        size = "?"
    return f"{type(dataset).__name__}[{size}]"


class SampleIndices:
    """The indices every DataLoader of ``evaluate`` fetched (module docstring: why by index)."""

    def __init__(self) -> None:
        self.indices: dict[str, list[int]] = {}
        self.samplers: dict[int, SamplerSeen] = {}
        self.unindexed = 0
        self._stack = contextlib.ExitStack()

    def attach(self, model: Any) -> None:
        from torch.utils.data.dataloader import _BaseDataLoaderIter

        self._stack.enter_context(_replaced(_BaseDataLoaderIter, "_next_index", self._wrap))

    def _wrap(self, original: Callable[[Any], Any]) -> Callable[[Any], Any]:
        observer = self

        def _next_index(it: Any) -> Any:
            index = original(it)  # StopIteration ends the epoch, as before
            observer.fetched(it, index)
            return index

        return _next_index

    def fetched(self, it: Any, index: Any) -> None:
        from torch.utils.data import DistributedSampler
        from torch.utils.data.dataloader import _DatasetKind

        if it._dataset_kind == _DatasetKind.Iterable:
            self.unindexed += 1
            return
        sampler = getattr(it._index_sampler, "sampler", it._index_sampler)
        if isinstance(sampler, DistributedSampler) and id(sampler) not in self.samplers:
            self.samplers[id(sampler)] = SamplerSeen(len(sampler.dataset), sampler.num_replicas,  # type: ignore[arg-type]
                                                     sampler.total_size, sampler.drop_last)
        batch = [int(i) for i in index] if isinstance(index, (list, tuple)) or hasattr(index, "tolist") \
            else [int(index)]
        root, mapped = _root(it._dataset, batch)
        self.indices.setdefault(_key(root), []).extend(mapped)

    def detach(self) -> SamplesSlice:
        self._stack.close()
        return SamplesSlice({k: tuple(v) for k, v in self.indices.items()}, tuple(self.samplers.values()),
                            self.unindexed)


def _values(tensor: Any) -> tuple[float, ...] | None:
    if tensor.numel() > SMALL_TENSOR:
        return None
    return tuple(float(v) for v in tensor.detach().reshape(-1).double().cpu().tolist())


class Collectives:
    """Collectives ``evaluate`` calls through ``torch.distributed`` (module attributes, which is
    how ``dist.all_reduce(...)`` resolves; a name imported before the call, ``from
    torch.distributed import all_reduce``, is not seen), with the values of small inputs and
    outputs.

    A gather first exchanges its tensor's shape with every rank on the side group, and when the
    shapes differ it raises :class:`UnevenGather` instead of issuing the gather. Measured on
    gloo (torch 2.13): the rank that receives more bytes than it allocated aborts the process
    ("Received data size doesn't match expected size", SIGABRT) and the others return garbage
    rows; NCCL hangs or returns garbage. Stopping it first names every rank's shape, and no
    process dies in C++ where nothing can be recorded.
    """

    def __init__(self, *, side_group: Any, world_size: int) -> None:
        self.calls: list[CollectiveCall] = []
        self.uneven: UnevenCollective | None = None
        self._side = side_group
        self._world_size = world_size
        self._gather_object: Callable[..., Any] | None = None
        self._stack = contextlib.ExitStack()

    def attach(self, model: Any) -> None:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        # The original, for the shape exchange of a gather (never recorded as the user's call).
        self._gather_object = c10d.all_gather_object
        wrappers: dict[str, Callable[[str, Callable[..., Any]], Callable[..., Any]]] = {
                    "all_reduce": self._reduce, "reduce": self._reduce, "all_gather": self._gather,
                    "all_gather_into_tensor": self._gather_into, "broadcast": self._plain,
                    "all_gather_object": self._plain, "gather": self._plain, "reduce_scatter": self._plain,
                    "barrier": self._plain}
        # torch.distributed's attributes only: torch's own functions call each other through
        # distributed_c10d's globals (all_gather_object -> all_gather), which stay untouched.
        for name, wrap in wrappers.items():
            if name in dist.__dict__:
                self._stack.enter_context(_replaced(dist, name, functools.partial(wrap, name)))

    def _plain(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(CollectiveCall(name, None, (), None, None))
            return original(*args, **kwargs)

        return call

    def _reduce(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def call(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            op = kwargs.get("op", args[1] if name == "reduce" and len(args) > 1 else args[0] if
                            name == "all_reduce" and args else None)
            before = _values(tensor)
            work = original(tensor, *args, **kwargs)
            after = None if kwargs.get("async_op") else _values(tensor)
            self.calls.append(CollectiveCall(name, _op_name(op), tuple(tensor.shape), before, after))
            return work

        return call

    def _gather(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def call(tensor_list: Any, tensor: Any, *args: Any, **kwargs: Any) -> Any:
            self._same_shape(name, tensor, kwargs.get("group", args[0] if args else None))
            self.calls.append(CollectiveCall(name, None, tuple(tensor.shape), _values(tensor), None))
            return original(tensor_list, tensor, *args, **kwargs)

        return call

    def _gather_into(self, name: str, original: Callable[..., Any]) -> Callable[..., Any]:
        def call(output: Any, tensor: Any, *args: Any, **kwargs: Any) -> Any:
            self._same_shape(name, tensor, kwargs.get("group", args[0] if args else None))
            self.calls.append(CollectiveCall(name, None, tuple(tensor.shape), _values(tensor), None))
            return original(output, tensor, *args, **kwargs)

        return call

    def _same_shape(self, name: str, tensor: Any, group: Any) -> None:
        import torch.distributed as dist

        if self._world_size < 2 or group not in (None, dist.group.WORLD):
            return  # a subgroup's members are not known here: not checked
        assert self._gather_object is not None, "attach() first"
        shapes: list[Any] = [None] * self._world_size
        # On the side group (gloo, object collectives), with the original function: every rank
        # that calls this gather exchanges its shape first, so the exchange lines up exactly as
        # the gather would have; a rank that skips the gather leaves it waiting just the same.
        self._gather_object(shapes, tuple(tensor.shape), group=self._side)
        if len(set(shapes)) > 1:
            self.uneven = UnevenCollective(name, len(self.calls), {r: tuple(s) for r, s in enumerate(shapes)})
            raise UnevenGather(self.uneven)

    def detach(self) -> CollectiveSlice:
        self._stack.close()
        return CollectiveSlice(tuple(self.calls), self.uneven)


def _op_name(op: Any) -> str | None:
    if op is None:
        return "SUM"  # torch's default
    return str(getattr(op, "name", op)).rsplit(".", 1)[-1]


class Buffers:
    """Digests of every buffer before and after ``evaluate``: BatchNorm's running statistics
    (and ``num_batches_tracked``) change only when a forward ran in train mode."""

    def __init__(self) -> None:
        self._module: Any = None
        self._before: dict[str, str] = {}

    def attach(self, model: Any) -> None:
        self._module = unwrap(model)
        self._before = {n: tensor_digest(b) for n, b in self._module.named_buffers()}

    def detach(self) -> BufferSlice:
        after = {n: tensor_digest(b) for n, b in self._module.named_buffers()}
        changed = tuple(n for n, d in after.items() if self._before.get(n) != d)
        return BufferSlice(len(after), changed)


def index_counts(samples: list[SamplesSlice]) -> dict[str, Counter[int]]:
    """Per dataset key, how many times each index was fetched over the given ranks' slices."""
    out: dict[str, Counter[int]] = {}
    for s in samples:
        for key, indices in s.indices.items():
            out.setdefault(key, Counter()).update(indices)
    return out
