"""The collectives the training step itself calls: in the forward, in the loss, and in the
backward of the ``autograd.Function`` that issued them (a tap of :mod:`.collectives`).

Contrastive and self-supervised losses gather features across ranks, Barlow Twins all-reduces
its cross-correlation matrix, detection losses all-reduce a count, SyncBatchNorm gathers its
statistics: each is a collective *inside* the step, and whether autograd sees it decides the
gradient. Each call of the first observed step is recorded as a :class:`StepCollective`:

- **the API** — ``torch.distributed`` called directly (autograd does not see it: the gradient
  through it stays rank-local), or from inside an ``autograd.Function``'s forward
  (``torch.distributed.nn.functional``, a hand-written ``GatherLayer``, SyncBatchNorm's own);
  read from the Python stack at the call;
- **the phase** — forward (the forward or the loss) or backward (autograd is executing the
  ``backward`` of a Python ``autograd.Function``: ``torch._C._current_autograd_node``), so a
  gather layer whose backward issues no collective is seen as such;
- whether its input required grad and grad mode was on, its shape, small values (a count),
  and the module whose ``forward`` called it (``None``: outside every module, the loss);
- for a gather into a list, whether the caller then put a tensor that requires grad into this
  rank's own slot (``own_slot_replaced``: the gathered copy has no gradient, the local one has).

DDP's own collectives (its buffer broadcast, its comm hook's all-reduces) are not the step's:
they are left out (issued from ``torch/nn/parallel`` or a comm hook, or from the backward of
something that is not a Python ``autograd.Function``). Plain values only: the slice crosses
the world's pipe.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
from dataclasses import dataclass
from typing import Any, TypedDict

from .collectives import SMALL_TENSOR, Called, Proceed, tap
from .probe import Probe, Slice, Step

#: The collectives a step may call inside its forward, loss or an ``autograd.Function``.
STEP_COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_single",
                    "reduce_scatter", "reduce_scatter_tensor", "reduce", "broadcast", "all_to_all", "all_to_all_single",
                    "gather", "scatter")
#: ``api`` of a collective autograd does not see.
PLAIN = "torch.distributed"
#: ``api`` of one issued from ``torch.distributed.nn.functional`` (differentiable).
FUNCTIONAL = "torch.distributed.nn.functional"
FORWARD, BACKWARD = "forward", "backward"
#: Calls recorded per step at most (a step that gathers per layer is summarised, not listed).
MOST = 64

# The wrappers' own collectives (DDP's reducer and comm hooks; FSDP2, replicate and DTensor
# under a target's parallelize) are the wrapper's, not the step's.
_SKIPPED_FILES = (f"{os.sep}torch{os.sep}nn{os.sep}parallel{os.sep}", "ddp_comm_hooks", "comm_hooks",
                  f"{os.sep}torch{os.sep}distributed{os.sep}fsdp{os.sep}",
                  f"{os.sep}torch{os.sep}distributed{os.sep}_composable{os.sep}",
                  f"{os.sep}torch{os.sep}distributed{os.sep}tensor{os.sep}")
_HERE = (os.path.realpath(__file__), os.path.realpath(sys.modules[Called.__module__].__file__ or ""))


@dataclass(frozen=True)
class StepCollective:
    """One collective the step called (module docstring)."""

    op: str
    api: str  # PLAIN, FUNCTIONAL or "autograd.Function <Name>"
    phase: str  # FORWARD | BACKWARD
    function: str | None  # the autograd.Function whose forward/backward issued it
    requires_grad: bool  # its input required grad
    grad_enabled: bool
    shape: tuple[int, ...]
    module: str | None  # the module whose forward called it ("": the root), None: outside (the loss)
    values_in: tuple[float, ...] | None = None
    own_slot_replaced: bool | None = None  # gathers into a list only

    @property
    def differentiable(self) -> bool:
        """Issued inside an ``autograd.Function``: autograd sees the op it belongs to."""
        return self.function is not None

    @property
    def where(self) -> str:
        return "the loss (outside every module)" if self.module is None else (self.module or "<the model>")

    def describe(self) -> str:
        grad = "input requires grad" if self.requires_grad else "input without grad"
        how = self.api if self.differentiable else f"{self.api}, not differentiable"
        return f"{self.op} {list(self.shape)} in {self.where} ({self.phase}; {how}; {grad})"


class StepCollectivesSlice(TypedDict):
    """The collectives of the first observed step (at most ``MOST``), and how many per step."""

    step_collectives: list[StepCollective]
    step_collective_counts: list[int]


def _first_tensor(called: Called) -> Any:
    import torch

    args = (*called.args, *called.kwargs.values())
    if called.name in ("all_gather", "all_gather_into_tensor", "all_gather_single", "reduce_scatter", "reduce_scatter_tensor",
                       "all_to_all", "all_to_all_single"):
        args = args[1:2] or args  # (output, input, ...): the input
    for arg in args:
        if isinstance(arg, torch.Tensor):
            return arg
        if isinstance(arg, (list, tuple)) and arg and isinstance(arg[0], torch.Tensor):
            return arg[0]
    return None


def _ctx_function(frame: Any) -> str | None:
    """The ``autograd.Function`` class whose ``forward``/``backward`` this frame runs, or None."""
    from torch.autograd.function import FunctionCtx

    code = frame.f_code
    if code.co_name not in ("forward", "backward") or not code.co_varnames:
        return None
    if not isinstance(frame.f_locals.get(code.co_varnames[0]), FunctionCtx):
        return None
    return str(code.co_qualname).rsplit(".", 2)[-2] if "." in code.co_qualname else code.co_name


class StepCollectives(Probe):
    """Records the collectives of the step (module docstring) on ``model``'s modules."""

    def __init__(self, model: Any, *, rank: int) -> None:
        self._names = {id(m): n for n, m in model.named_modules()}
        self._rank = rank
        self._on = False
        self._step = 0
        self.calls: list[StepCollective] = []
        self.counts: list[int] = []
        self._lists: list[tuple[int, list[Any], Any]] = []  # (call index, output list, its own slot)

    def attach(self, stack: contextlib.ExitStack) -> None:
        tap(stack, self._record, STEP_COLLECTIVES)

    def begin_step(self, step: Step) -> None:
        self._on, self._step = True, step.index
        self.counts.append(0)

    def end_step(self, step: Step) -> Slice:
        # Read after the loss was computed from the gathered list: what this rank's slot holds now.
        self._on = False
        for index, out, placeholder in self._lists:
            mine = out[self._rank]
            replaced = mine is not placeholder and bool(getattr(mine, "requires_grad", False))
            self.calls[index] = dataclasses.replace(self.calls[index], own_slot_replaced=replaced)
        self._lists = []
        return {}

    def result(self) -> Slice:
        return StepCollectivesSlice(step_collectives=list(self.calls), step_collective_counts=list(self.counts))

    def _record(self, called: Called, proceed: Proceed) -> Any:
        if not self._on:
            return proceed()
        seen = self._seen(called)
        if seen is not None:
            self.counts[-1] += 1
            if self._step == 0 and len(self.calls) < MOST:
                self.calls.append(seen)
                out = called.args[0] if called.args else called.kwargs.get("tensor_list")
                if called.name == "all_gather" and isinstance(out, list) and len(out) > self._rank:
                    self._lists.append((len(self.calls) - 1, out, out[self._rank]))
        return proceed()

    def _seen(self, called: Called) -> StepCollective | None:
        """The call as the step made it, or None: DDP's own, or not the step's."""
        import torch

        node = torch._C._current_autograd_node()
        from torch.autograd.function import BackwardCFunction

        if node is not None and not isinstance(node, BackwardCFunction):
            return None  # a hook of DDP's reducer (its comm hook) or an engine callback
        function, api, module = None, PLAIN, None
        frame = sys._getframe(1)
        while frame is not None:
            path = frame.f_code.co_filename
            if any(part in path for part in _SKIPPED_FILES):
                return None
            if os.path.realpath(path) not in _HERE:
                if function is None:
                    function = _ctx_function(frame)
                    if function is not None:
                        api = (FUNCTIONAL if path.endswith(os.path.join("distributed", "nn", "functional.py"))
                               else f"autograd.Function {function}")
                owner = frame.f_locals.get("self")
                if owner is not None and id(owner) in self._names:
                    module = self._names[id(owner)]
                    break
            frame = frame.f_back
        if node is not None:
            function = type(node).__name__.removesuffix("Backward")
            api = f"autograd.Function {function}"
        tensor = _first_tensor(called)
        small = tensor is not None and tensor.numel() <= SMALL_TENSOR
        return StepCollective(
            op=called.name, api=api, phase=BACKWARD if node is not None else FORWARD, function=function,
            requires_grad=bool(getattr(tensor, "requires_grad", False)), grad_enabled=torch.is_grad_enabled(),
            shape=tuple(tensor.shape) if tensor is not None else (), module=module,
            values_in=tuple(float(v) for v in tensor.detach().reshape(-1).double().cpu().tolist()) if small else None)
