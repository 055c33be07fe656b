"""The forwards probe: forward calls through the DDP wrapper and through the module it wraps,
and whether each was a training forward.

- **DDP vs inner.** Forwards through the inner module only mean DDP was bypassed
  (``model.module(x)``); one forward per optimizer step means ``train_step`` does no
  accumulation. With ``rounds`` (the all-reduce rounds completed so far, ``CommRounds``),
  each DDP forward with autograd on also notes how many rounds had completed when it started:
  DDP decides at *forward* time whether that backward synchronises, so a forward after whose
  start no round completed before the step kept its gradients rank-local.
- **Training vs not.** A forward with autograd on and the module in training mode is
  training; one with autograd off (``no_grad``) or in eval mode is an evaluation. Counted into
  a shared tally (``kinds``) for rank-consistency's look at what ranks did besides training;
  forwards traced into a compiled graph are not counted there (the hook stays out of the
  user's graph).
- **The sync flag** (``SyncFlags``): ``require_backward_grad_sync`` at the step's last DDP
  forward and when its backward began: set in between, DDP had already decided.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, TypedDict

from .comm_rounds import CommRounds
from .probe import Counts, Probe, Slice, Step
from .unseen import unseen

#: Forwards of a wrapped model with autograd on and the module in training mode.
TRAINING = "training forward"
#: Forwards of a wrapped model with autograd off (``no_grad``) or the module in eval mode.
OUTSIDE = "forward outside training"


class ForwardCountSlice(TypedDict):
    """Per step: forwards through the DDP wrapper, through the inner module, and DDP forwards
    whose backward no all-reduce round followed (None: rounds not counted)."""

    ddp_forwards: list[int]
    inner_forwards: list[int]
    unsynchronised_forwards: list[int | None]


class Forwards(Probe):
    """Forwards of ``inner`` (and of its DDP ``wrapper``) per step, from the run's start; or,
    with ``kinds``, of every model handed to :meth:`watch` while the run lasts (the models a
    loop wraps), each counted as ``TRAINING`` or ``OUTSIDE`` (``on_training`` runs at the start
    of each training forward)."""

    def __init__(self, *, wrapper: Any = None, inner: Any = None, rounds: CommRounds | None = None,
                 kinds: Counts | None = None, on_training: Callable[[], None] | None = None) -> None:
        self.wrapper, self.inner_module, self.rounds_of = wrapper, inner, rounds
        self.kinds, self.on_training = kinds, on_training
        self.ddp = self.inner = 0
        self.starts: list[int] = []  # rounds completed at each grad forward through DDP
        self.rounds: Callable[[], int] | None = None
        self.out = ForwardCountSlice(ddp_forwards=[], inner_forwards=[], unsynchronised_forwards=[])
        self._handles: list[Any] = []

    def attach(self, stack: contextlib.ExitStack) -> None:
        # The round counter attached first: its rounds, when it counts them.
        self.rounds = self.rounds_of.rounds() if self.rounds_of is not None else None
        stack.callback(self._remove)
        if self.wrapper is not None:
            self._handles.append(self.wrapper.register_forward_pre_hook(unseen(self._on_ddp)))
        if self.inner_module is not None:
            self._handles.append(self.inner_module.register_forward_pre_hook(unseen(self._on_inner)))

    def watch(self, model: Any) -> None:
        """Count the forwards of ``model`` (the module a DDP wrapper wraps, or the model itself:
        a forward through ``model.module`` is counted too)."""
        # prepend: before the wrapper's own pre-forward hooks. FSDP2 unshards the parameters in
        # its hook and frees them again in backward; a checkpoint taken after it would read (and
        # pin) the unsharded ones instead of the sharded parameters the optimizer updates.
        self._handles.append(getattr(model, "module", model).register_forward_pre_hook(
            unseen(self._on_inner), prepend=True))

    def _on_ddp(self, module: Any, args: Any) -> None:
        import torch

        self.ddp += 1
        if self.rounds is not None and torch.is_grad_enabled():
            self.starts.append(self.rounds())

    def _on_inner(self, module: Any, args: Any) -> None:
        if self.kinds is not None:
            import torch

            if torch.compiler.is_compiling():
                return  # traced into a compiled forward, it would be a graph break of the suite's own
            training = torch.is_grad_enabled() and module.training
            self.kinds.add(TRAINING if training else OUTSIDE)
            if training and self.on_training is not None:
                self.on_training()
        self.inner += 1

    def unsynchronised(self) -> int | None:
        """This step's DDP forwards (with autograd) after whose start no all-reduce round
        completed: their backward's gradients stayed rank-local (None: rounds not counted)."""
        if self.rounds is None:
            return None
        now = self.rounds()
        late = sum(1 for start in self.starts if start == now)
        self.starts = []
        return late

    def end_step(self, step: Step) -> Slice:
        self.out["unsynchronised_forwards"].append(self.unsynchronised())
        self.out["ddp_forwards"].append(self.ddp)
        self.out["inner_forwards"].append(self.inner)
        self.ddp = self.inner = 0
        return {}  # the steps are lists in ``result``

    def result(self) -> ForwardCountSlice:
        return self.out

    def _remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()


class SyncFlagSlice(TypedDict):
    """Per step: the last DDP forward (with autograd) saw ``require_backward_grad_sync`` False
    and its backward began with the flag True — set between them, after DDP had decided."""

    sync_flag_after_forward: list[bool]


class SyncFlags(Probe):
    """When ``require_backward_grad_sync`` changed around the step's last DDP forward.

    DDP reads the flag in ``forward``: a backward synchronises when its forward saw it set.
    build-nanogpt sets it before each micro-step's forward; moved below the forward, the last
    micro-step's backward runs with the flag True but unsynchronised. ``no_sync()`` around the
    wrong micro-steps gives the same all-reduce rounds, but its flag is still False in that
    backward: so the flag is read twice, at the forward and when the backward reaches the
    forward's output (a hook on its first output that needs a gradient, reached first)."""

    def __init__(self, wrapper: Any) -> None:
        self.wrapper = wrapper
        self.at_forward: bool | None = None
        self.at_backward: bool | None = None
        self.out = SyncFlagSlice(sync_flag_after_forward=[])

    def attach(self, stack: contextlib.ExitStack) -> None:
        stack.callback(self.wrapper.register_forward_pre_hook(unseen(self._forward)).remove)
        stack.callback(self.wrapper.register_forward_hook(unseen(self._output)).remove)

    def _forward(self, module: Any, args: Any) -> None:
        import torch

        if torch.is_grad_enabled():
            self.at_forward = bool(getattr(module, "require_backward_grad_sync", True))

    def _output(self, module: Any, args: Any, output: Any) -> None:
        import torch

        if not torch.is_grad_enabled() or torch.compiler.is_compiling():
            return
        values = (output.values() if isinstance(output, dict)
                  else output if isinstance(output, (tuple, list)) else (output,))
        first = next((t for t in values if isinstance(t, torch.Tensor) and t.requires_grad), None)
        self.at_backward = None
        if first is not None:
            first.register_hook(lambda grad: self._backward(module))

    def _backward(self, module: Any) -> None:
        self.at_backward = bool(getattr(module, "require_backward_grad_sync", True))

    def end_step(self, step: Step) -> Slice:
        self.out["sync_flag_after_forward"].append(self.at_forward is False and self.at_backward is True)
        self.at_forward = self.at_backward = None
        return {}

    def result(self) -> SyncFlagSlice:
        return self.out
