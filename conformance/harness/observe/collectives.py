"""The collectives probe: the one patch of ``torch.distributed``, and the taps that read it.

User code calls a collective as ``dist.all_reduce(...)``: a module attribute looked up at call
time, so replacing the attribute sees it (a name imported before the call, ``from
torch.distributed import all_reduce``, is not seen; torch's own functions call each other
through ``distributed_c10d``'s globals, which stay untouched). Each name is replaced once, by a
dispatcher, however many probes watch it: a probe *taps* the names it needs (:func:`tap`, a
layer ``layer(called, proceed)`` that observes the call and calls ``proceed()`` to pass it on,
as the comm hook chain's layers do, ``harness.comm_hooks``), and the attribute is put back
when the last tap's stack closes. A new observation of collectives is one new tap:

- :class:`CallCounts` — how often the loop called each collective (rank-consistency's look);
- :class:`CallRecords` — every call with its shapes and small values, and a gather of uneven
  shapes stopped before it is issued (eval-equivalence);
- :class:`AllReduceBytes` — the bytes of each ``all_reduce`` (a comm hook's traffic: scaling-cliff).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from ..patching import replaced
from .probe import Counts, Probe, Slice

#: The collectives tapped when a probe names none: what a loop may call as ``torch.distributed.<name>``.
COLLECTIVES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor", "reduce", "gather", "scatter", "barrier", "all_to_all",
               "all_to_all_single", "all_gather_object", "broadcast_object_list", "gather_object",
               "scatter_object_list", "send", "recv", "isend", "irecv")
#: Inputs of a collective up to this many elements have their values recorded: metrics, sums and
#: counts (what the cause analysis reads), never a model's worth of predictions.
SMALL_TENSOR = 64


@dataclass(frozen=True)
class Called:
    """One call of ``torch.distributed.<name>`` as the user made it."""

    name: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]


#: ``proceed()``: the rest of the taps, then torch's own function.
Proceed = Callable[[], Any]
#: ``layer(called, proceed)``: one tap's view of a call; returns what ``proceed()`` returned.
Layer = Callable[[Called, Proceed], Any]

# name -> the layers tapping it, outermost first; and what puts the attribute back.
_LAYERS: dict[str, list[Layer]] = {}
_RESTORE: dict[str, contextlib.ExitStack] = {}


def _dispatcher(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        called = Called(name, args, kwargs)
        # The chain built inside out from partials, not a closure that calls itself: that
        # closure is a reference cycle holding the call's arguments, freed only when the
        # collector reaches its generation. The comm hook's all-reduce of DDP's first, whole-
        # model bucket then stayed resident beside the rebuilt buckets (docs/memory.md).
        proceed: Proceed = functools.partial(original, *args, **kwargs)
        for layer in reversed(_LAYERS.get(name, ())):
            proceed = functools.partial(layer, called, proceed)
        return proceed()

    return call


def _untap(name: str, layer: Layer) -> None:
    layers = _LAYERS[name]
    layers.remove(layer)
    if not layers:
        del _LAYERS[name]
        _RESTORE.pop(name).close()


def tap(stack: contextlib.ExitStack, layer: Layer, names: Sequence[str] = COLLECTIVES) -> None:
    """``layer`` sees every call of ``torch.distributed.<name>`` for each of ``names`` that
    torch has, until ``stack`` closes (module docstring)."""
    import torch.distributed as dist

    for name in names:
        if not callable(getattr(dist, name, None)):
            continue
        if name not in _LAYERS:
            restore = contextlib.ExitStack()
            restore.enter_context(replaced(dist, name, functools.partial(_dispatcher, name)))
            _LAYERS[name], _RESTORE[name] = [], restore
        _LAYERS[name].append(layer)
        stack.callback(_untap, name, layer)


class CallCounts(Probe):
    """Each collective the code calls, counted by name into ``counts`` (shared with the
    forwards probe: one tally of what a rank did besides training, ``Forwards``)."""

    def __init__(self, counts: Counts) -> None:
        self.counts = counts

    def attach(self, stack: contextlib.ExitStack) -> None:
        tap(stack, self._count)

    def _count(self, called: Called, proceed: Proceed) -> Any:
        self.counts.add(called.name)
        return proceed()


class AllReduceBytes(Probe):
    """The bytes of every ``torch.distributed.all_reduce``, appended to ``sent``: a comm hook's
    (the stock fp16/bf16 compression and PowerSGD hooks call it, from DDP's thread and from
    their futures' callbacks). DDP's own buckets go through its C++ reducer and are not
    counted: an empty list is DDP's layout."""

    def __init__(self, sent: list[int]) -> None:
        self.sent = sent

    def attach(self, stack: contextlib.ExitStack) -> None:
        tap(stack, self._bytes, ("all_reduce",))

    def _bytes(self, called: Called, proceed: Proceed) -> Any:
        tensor = called.args[0] if called.args else called.kwargs["tensor"]
        self.sent.append(tensor.numel() * tensor.element_size())
        return proceed()


# -- every call recorded, uneven gathers stopped ----------------------------------------------


@dataclass(frozen=True)
class CollectiveCall:
    """One collective called (through ``torch.distributed``), in call order."""

    op: str  # "all_reduce", "all_gather", ...
    reduce_op: str | None  # "SUM", "MAX"... for reductions
    shape: tuple[int, ...]
    #: The input's values before the call (small tensors only: metrics, counts), else None.
    values_in: tuple[float, ...] | None
    values_out: tuple[float, ...] | None


@dataclass(frozen=True)
class UnevenCollective:
    """A gather whose tensors differ in shape across ranks, found before it was issued."""

    op: str
    call_index: int  # its position among this rank's collectives
    shapes: dict[int, tuple[int, ...]]  # rank -> the shape it would have sent


@dataclass(frozen=True)
class CollectiveSlice:
    calls: tuple[CollectiveCall, ...]
    uneven: UnevenCollective | None = None


class CallRecordsSlice(TypedDict):
    collectives: CollectiveSlice


class UnevenGather(RuntimeError):
    """Raised in place of a gather whose tensors differ in shape across ranks (``CallRecords``)."""

    def __init__(self, found: UnevenCollective) -> None:
        shapes = ", ".join(f"rank {r} {list(s)}" for r, s in sorted(found.shapes.items()))
        super().__init__(f"{found.op} of tensors of different shapes across ranks: {shapes}")
        self.found = found


def _values(tensor: Any) -> tuple[float, ...] | None:
    if tensor.numel() > SMALL_TENSOR:
        return None
    return tuple(float(v) for v in tensor.detach().reshape(-1).double().cpu().tolist())


def _op_name(op: Any) -> str | None:
    if op is None:
        return "SUM"  # torch's default
    return str(getattr(op, "name", op)).rsplit(".", 1)[-1]


class CallRecords(Probe):
    """Collectives called through ``torch.distributed``, with the values of small inputs and
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

    def attach(self, stack: contextlib.ExitStack) -> None:
        from torch.distributed import distributed_c10d as c10d

        # The original, for the shape exchange of a gather (never recorded as the user's call).
        self._gather_object = c10d.all_gather_object
        readers: dict[str, Callable[[Called, Proceed], Any]] = {
            "all_reduce": self._reduce, "reduce": self._reduce, "all_gather": self._gather,
            "all_gather_into_tensor": self._gather, "broadcast": self._plain, "all_gather_object": self._plain,
            "gather": self._plain, "reduce_scatter": self._plain, "barrier": self._plain}
        tap(stack, lambda called, proceed: readers[called.name](called, proceed), tuple(readers))

    def _plain(self, called: Called, proceed: Proceed) -> Any:
        self.calls.append(CollectiveCall(called.name, None, (), None, None))
        return proceed()

    def _reduce(self, called: Called, proceed: Proceed) -> Any:
        name = called.name

        def call(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            op = kwargs.get("op", args[1] if name == "reduce" and len(args) > 1 else args[0] if
                            name == "all_reduce" and args else None)
            before = _values(tensor)
            work = proceed()
            after = None if kwargs.get("async_op") else _values(tensor)
            self.calls.append(CollectiveCall(name, _op_name(op), tuple(tensor.shape), before, after))
            return work

        return call(*called.args, **called.kwargs)

    def _gather(self, called: Called, proceed: Proceed) -> Any:
        # all_gather(tensor_list, tensor, ...) and all_gather_into_tensor(output, tensor, ...)
        def call(_out: Any, tensor: Any, *args: Any, **kwargs: Any) -> Any:
            self._same_shape(called.name, tensor, kwargs.get("group", args[0] if args else None))
            self.calls.append(CollectiveCall(called.name, None, tuple(tensor.shape), _values(tensor), None))
            return proceed()

        return call(*called.args, **called.kwargs)

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

    def result(self) -> Slice:
        return CallRecordsSlice(collectives=CollectiveSlice(tuple(self.calls), self.uneven))
