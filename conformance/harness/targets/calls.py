"""The one way every check calls a target's code: the loss, the optimizer and the step.

Checks never call the user's functions directly: they call ``target.compute_loss``,
``target.make_optimizer`` and ``target.run_step``, which pass the arguments each function's
signature asks for and check what it returned. The suite's defaults (SGD, the textbook
accumulation step) live here too: a target without ``build_optimizer`` or ``train_step`` gets
them, and a target may import ``default_train_step`` to wrap it.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Callable

from ..batches import call_model
from ..returned import optimizer_problem
from ..target_calls import defined_at, positional_count, takes_keyword, takes_model
from .errors import SEE, TargetError, call_target

#: torch's warning for a loss whose input and target shapes differ and silently broadcast
#: (mse_loss, l1_loss…): the loss is then wrong on every rank alike, so no check would see it.
_BROADCAST_WARNING = r"Using a target size .* that is different to the input size"


def default_build_optimizer(params: Any) -> Any:
    import torch

    return torch.optim.SGD(params, lr=0.1)


def accumulate_step(model: Any, optimizer: Any, microbatches: list[tuple[Any, Any]],
                    loss_of: Callable[[Any, Any, Any], Any]) -> None:
    """The textbook DDP step: no_sync on all but the last microbatch, loss divided by K;
    ``loss_of(model, inputs, targets)`` computes one microbatch's loss. FSDP2 and the composable
    ``replicate`` (``parallelize``) have no ``no_sync``: their switch is
    ``set_requires_gradient_sync``, set False on all but the last microbatch."""
    optimizer.zero_grad(set_to_none=True)
    k = len(microbatches)
    fsdp_sync = getattr(getattr(model, "_orig_mod", model), "set_requires_gradient_sync", None)
    for i, (inputs, targets) in enumerate(microbatches):
        # Only the last backward of the window may reduce; the others just accumulate.
        if fsdp_sync is not None:
            fsdp_sync(i == k - 1)
        sync = contextlib.nullcontext() if i == k - 1 or not hasattr(model, "no_sync") else model.no_sync()
        with sync:
            loss = loss_of(model, inputs, targets) / k
            loss.backward()
    optimizer.step()


def default_train_step(model: Any, optimizer: Any, microbatches: list[tuple[Any, Any]],
                       loss_fn: Callable[[Any, Any], Any]) -> None:
    """The textbook DDP step with ``loss_fn(model(inputs), targets)`` (what a target gets
    without a train_step; importable by targets that wrap it)."""
    accumulate_step(model, optimizer, microbatches, lambda m, x, y: loss_fn(call_model(m, x), y))


class TargetCalls:
    """The one way every check calls a target's code (a loaded Target, or a chaos vehicle that
    has the same names): the loss, the optimizer and the step, each with the arguments its
    signature asks for and each checked."""

    name: str
    loss_fn: Callable[[Any, Any], Any] | None
    build_optimizer: Callable[[Any], Any]
    train_step: Callable[..., None]

    def compute_loss(self, model: Any, inputs: Any, targets: Any) -> Any:
        """One microbatch's loss: ``forward_loss(model, (inputs, targets))`` when the target
        defines it, else ``loss_fn(model(inputs), targets)`` (``model(*inputs)`` for a tuple,
        ``model(**inputs)`` for a dict: ``batches.call_model``); a scalar tensor, or a TargetError."""
        forward_loss = getattr(self, "forward_loss", None)
        if forward_loss is not None:
            loss = call_target(self, "forward_loss", forward_loss, model, (inputs, targets))
            return _scalar_loss(self, "forward_loss", forward_loss, loss)
        outputs = call_target(self, "the model's forward", call_model, model, inputs)
        return self.checked_loss_fn(outputs, targets)

    def checked_loss_fn(self, outputs: Any, targets: Any) -> Any:
        """``loss_fn(outputs, targets)``, refusing shapes that silently broadcast and a loss that
        is not a scalar (what a custom train_step receives as its ``loss_fn``)."""
        loss_fn = self.loss_fn
        if loss_fn is None:
            raise TargetError(f"target {self.name!r} defines forward_loss and no loss_fn, but its "
                              f"train_step called loss_fn; compute the loss through the model "
                              f"there, or define loss_fn(outputs, targets) ({SEE})")
        with warnings.catch_warnings():
            warnings.filterwarnings("error", message=_BROADCAST_WARNING, category=UserWarning)
            loss = call_target(self, "loss_fn", loss_fn, outputs, targets)
        return _scalar_loss(self, "loss_fn", loss_fn, loss)

    def _loss_fn_argument(self) -> Callable[[Any, Any], Any]:
        """What a custom train_step receives as ``loss_fn``: the checked loss under the user's
        name for it, so a wrong call reads "loss_fn() got an unexpected keyword…"."""
        def loss_fn(outputs: Any, targets: Any) -> Any:
            return self.checked_loss_fn(outputs, targets)

        loss_fn.__qualname__ = "loss_fn"
        return loss_fn

    def make_optimizer(self, model: Any) -> Any:
        """``build_optimizer(model)`` (the bare module, not the DDP wrapper) or
        ``build_optimizer(model.parameters())``, as its first parameter's name says."""
        fn = self.build_optimizer
        bare = getattr(model, "module", model)
        arg = bare if takes_model(fn) else model.parameters()
        # Judged here, where every check gets its optimizer: a None or a list would otherwise
        # fail inside the step as "'NoneType' object has no attribute 'step'", blamed on DDP.
        return optimizer_checked(self, call_target(self, "build_optimizer", fn, arg))

    def run_step(self, model: Any, optimizer: Any, microbatches: list[tuple[Any, Any]], *,
                 step: int = 0) -> None:
        """One optimizer step of the target's ``train_step`` on this rank's microbatches
        (``step``: the index of this step, for a train_step that asks for it)."""
        fn = self.train_step
        if fn is default_train_step:
            accumulate_step(model, optimizer, microbatches, self.compute_loss)
            return
        args: list[Any] = [model, optimizer, microbatches]
        if positional_count(fn, besides=("step",)) >= 4:
            args.append(self._loss_fn_argument())
        kwargs = {"step": step} if takes_keyword(fn, "step") else {}
        call_target(self, "train_step", fn, *args, **kwargs)


def optimizer_checked(target: Any, optimizer: Any) -> Any:
    """``optimizer``, what ``target.build_optimizer`` returned, or the TargetError saying what
    it returned instead of an optimizer (``returned.optimizer_problem``)."""
    problem = optimizer_problem(optimizer, zero_grad=target.train_step is default_train_step)
    if problem is not None:
        raise TargetError(f"target {target.name!r}: build_optimizer (defined at "
                          f"{defined_at(target.build_optimizer)}) {problem}; return the optimizer "
                          f"it builds, e.g. torch.optim.SGD(params, lr=0.1) ({SEE})")
    return optimizer


def _scalar_loss(target: Any, what: str, fn: Callable[..., Any], loss: Any) -> Any:
    import torch

    if not isinstance(loss, torch.Tensor):
        raise TargetError(f"target {target.name!r}: {what} (defined at {defined_at(fn)}) returned a "
                          f"{type(loss).__name__}, not a loss tensor; return the scalar loss "
                          f"({SEE})")
    if loss.numel() != 1:
        raise TargetError(f"target {target.name!r}: {what} (defined at {defined_at(fn)}) returned "
                          f"a loss of shape {tuple(loss.shape)}, not a scalar; reduce it, e.g. "
                          f".mean() over the microbatch ({SEE})")
    return loss
