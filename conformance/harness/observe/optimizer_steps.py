"""The optimizer-step probe: every ``optimizer.step()`` of the code under observation.

torch's *global* step hooks (``torch.optim.optimizer.register_optimizer_step_pre_hook`` /
``..._post_hook``) see every ``torch.optim`` optimizer the code creates, however it creates it,
with no reference to it beforehand: what a loop the user wrote needs. ``GradScaler.step``
(at class level: the loop creates its own scalers) is where a mixed-precision step is decided
(a scaler skips the optimizer's step on inf/NaN), so a probe may wrap it too. An object of the
loop's own with a ``step`` method and no hooks is not seen.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from ..patching import replaced
from .probe import Probe

#: ``hook(optimizer, args, kwargs)``: torch's step hook signature.
StepHook = Callable[[Any, Any, Any], None]


class OptimizerSteps(Probe):
    """``pre`` and ``post`` run around every optimizer step while the run lasts (``post`` where
    the step returns: a look at the state it produced); ``steps`` counts the steps taken.
    ``scaler_step(original)`` returns the ``GradScaler.step`` to run instead, when given."""

    def __init__(self, *, pre: StepHook | None = None, post: StepHook | None = None,
                 scaler_step: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None) -> None:
        self.pre, self.post, self.scaler_step = pre, post, scaler_step
        self.steps = 0

    def attach(self, stack: contextlib.ExitStack) -> None:
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        if self.pre is not None:
            stack.callback(register_optimizer_step_pre_hook(self.pre).remove)
        stack.callback(register_optimizer_step_post_hook(self._stepped).remove)
        if self.scaler_step is not None:
            from torch.amp.grad_scaler import GradScaler

            stack.enter_context(replaced(GradScaler, "step", self.scaler_step))

    def _stepped(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self.steps += 1
        if self.post is not None:
            self.post(optimizer, args, kwargs)
