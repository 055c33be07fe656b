"""Rank-side instruments of a recorded run: what the optimizer consumed, what DDP did, what
clipping hid, and the first non-finite value.

Each instrument observes the target's own ``train_step`` without changing what it computes:

- :class:`StepRecorder` — an optimizer *step pre-hook* sees every gradient at the moment
  ``optimizer.step()`` reads it (copied, or handed uncopied to an ``observe`` callback that
  compares it in place). Judging ``.grad`` after ``train_step`` returned is wrong for
  real code: nanoGPT calls ``zero_grad(set_to_none=True)`` *after* the step, which leaves no
  gradient to inspect (and a comparison of nothing against nothing "passes").
- :class:`ClipProbe` — wraps ``torch.nn.utils.clip_grad_norm_`` to see (copy or observe) the
  gradients it is about to clip and the total norm it measured: a gradient K times too large and then clipped
  to ``max_norm`` is indistinguishable from a correct one after clipping.
- :func:`first_nonfinite` — the first NaN/Inf among named tensors.

The recorded step's own probes (``harness.observe.Probe``: attach, observe each step, return
a typed slice) are built on them: :class:`BatchDigests`, :class:`Routing`,
:class:`CompileWatch`, :class:`Features` here; the gradient recorder and the clip probe, which
write or compare what they see against the reference's snapshots, in ``recording``. The
bucket all-reduces and the forwards are counted by the shared probes (``harness.observe``:
``CommRounds``, ``Forwards``).

Functions here run inside rank processes; torch is imported lazily.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ...harness.features import FeatureProbe
from ...harness.observe import Probe, Step
from .compiled import watch_compile
from .records import CompileSlice, DataSlice, FeaturesSlice, RoutingSlice
from .routing import RoutingProbe


def cpu_copy(tensor: Any) -> Any:
    return None if tensor is None else tensor.detach().cpu().clone()


def nonfinite_output(output: Any) -> bool:
    """Does a forward's output (a tensor, or a tuple/list of them) hold a NaN or an Inf?"""
    import torch

    tensors = output if isinstance(output, (tuple, list)) else (output,)
    return any(isinstance(t, torch.Tensor) and t.is_floating_point()
               and not bool(torch.isfinite(t.detach()).all()) for t in tensors)


def first_nonfinite(named: Iterable[tuple[str, Any]]) -> str | None:
    """Name of the first tensor holding a NaN or an Inf (None when all are finite)."""
    import torch

    for name, tensor in named:
        if tensor is None or not tensor.is_floating_point():
            continue
        # A sum is one pass without a temporary (40x cheaper than isfinite on 16M elements) and
        # NaN/Inf propagate into it; only a non-finite sum (or an overflow of a finite tensor's
        # sum) pays for the exact test.
        if bool(torch.isfinite(tensor.sum())):
            continue
        if not bool(torch.isfinite(tensor).all()):
            return name
    return None


def first_nonfinite_of_norms(named: list[tuple[str, Any]], norms: dict[str, float | None]) -> str | None:
    """``first_nonfinite(named)``, given each tensor's float64 norm (``adaptive.gradient_norms``,
    taken anyway at every step): a NaN or an Inf anywhere in a tensor makes its norm NaN or Inf,
    so only tensors whose norm is not finite are searched, exactly, and the pass over every
    gradient is not made twice. (A float64 tensor whose squares overflowed has an infinite norm
    and is found finite there.)"""
    return first_nonfinite((name, t) for name, t in named if not math.isfinite(norms.get(name) or 0.0))


@dataclass
class StepRecorder:
    """Gradients as ``optimizer.step()`` saw them, per train_step call.

    ``names`` maps parameter identity to its name in the (unwrapped) model, so gradients are
    keyed exactly as ``param_state`` keys parameters.
    """

    names: dict[int, str]
    params: list[tuple[str, Any]] = field(default_factory=list)  # the model's, by name
    steps: int = 0  # optimizer.step() calls during the current train_step
    grads: dict[str, Any] | None = None  # the first optimizer.step() of the current train_step
    handle: Any = None
    # Given: called with the live (name, gradient or None) pairs at the first step instead of
    # copying them (the comparison happens right there, on the device; no copy is kept).
    observe: Callable[[list[tuple[str, Any]]], None] | None = None

    @classmethod
    def attach(cls, model: Any, optimizer: Any, *,
               observe: Callable[[list[tuple[str, Any]]], None] | None = None) -> StepRecorder:
        params = list(model.named_parameters())
        recorder = cls(names={id(p): n for n, p in params}, params=params, observe=observe)

        def pre_step(opt: Any, args: Any, kwargs: Any) -> None:
            recorder.steps += 1
            if recorder.steps == 1:
                if recorder.observe is not None:
                    recorder.observe(list(recorder.live(opt).items()))
                else:
                    recorder.grads = recorder._snapshot(opt)

        register = getattr(optimizer, "register_step_pre_hook", None)
        # A hand-written optimizer object (a class with step() and zero_grad(), no
        # torch.optim.Optimizer base) has no hooks: its step is wrapped on the instance instead.
        recorder.handle = register(pre_step) if callable(register) else _StepWrapper.around(optimizer, pre_step)
        return recorder

    def live(self, optimizer: Any) -> dict[str, Any]:
        """The gradients the optimizer is about to read, by name, uncopied. Every parameter of
        the model gets an entry: None is "no gradient reached the optimizer for it" (frozen,
        unused, or zeroed with set_to_none before the step)."""
        out: dict[str, Any] = dict.fromkeys(self.names.values())
        # An optimizer without param_groups (hand-written) is taken to update the whole model.
        groups = getattr(optimizer, "param_groups", None) or [{"params": [p for _, p in self.params]}]
        for group in groups:
            for p in group["params"]:
                name = self.names.get(id(p))
                if name is not None:
                    out[name] = None if p.grad is None else p.grad.detach()
        return out

    def _snapshot(self, optimizer: Any) -> dict[str, Any]:
        return {name: cpu_copy(g) for name, g in self.live(optimizer).items()}

    def reset(self) -> None:
        self.steps = 0
        self.grads = None

    def close(self) -> None:
        if self.handle is not None:
            self.handle.remove()


@dataclass
class _StepWrapper:
    """``optimizer.step`` wrapped on the instance to call ``before(optimizer, args, kwargs)``
    first, as a step pre-hook would; ``remove()`` puts the class's step back in view."""

    optimizer: Any
    had_own: bool
    own: Any

    @classmethod
    def around(cls, optimizer: Any, before: Callable[[Any, Any, Any], None]) -> _StepWrapper:
        had_own = "step" in getattr(optimizer, "__dict__", {})
        wrapper = cls(optimizer, had_own, optimizer.__dict__.get("step") if had_own else None)
        original = optimizer.step

        def step(*args: Any, **kwargs: Any) -> Any:
            before(optimizer, args, kwargs)
            return original(*args, **kwargs)

        optimizer.step = step
        return wrapper

    def remove(self) -> None:
        if self.had_own:
            self.optimizer.step = self.own
        else:
            with contextlib.suppress(AttributeError):
                del self.optimizer.step


@dataclass
class ClipProbe:
    """``clip_grad_norm_`` observed: the gradients before clipping and the norms it measured.

    Patched where user code finds it: ``torch.nn.utils``, ``torch.nn.utils.clip_grad`` and any
    global of the given namespaces bound to the original function (``from torch.nn.utils
    import clip_grad_norm_`` in the target file).
    """

    names: dict[int, str]
    calls: list[dict[str, float]] = field(default_factory=list)  # this train_step's calls
    pre_clip: dict[str, Any] | None = None  # gradients at the last call before the first step
    frozen: bool = False  # set once the first optimizer step of the step happened
    # Given: called with the live (name, gradient) pairs before each clip instead of copying.
    observe: Callable[[list[tuple[str, Any]]], None] | None = None
    _restore: list[tuple[Any, str, Any]] = field(default_factory=list)

    @classmethod
    def attach(cls, model: Any, namespaces: Iterable[dict[str, Any]], *,
               observe: Callable[[list[tuple[str, Any]]], None] | None = None) -> ClipProbe:
        import torch.nn.utils.clip_grad as clip_module
        from torch.nn import utils

        probe = cls(names={id(p): n for n, p in model.named_parameters()}, observe=observe)
        original: Callable[..., Any] = clip_module.clip_grad_norm_
        # torch >= 2.6's split form, as torchtitan clips: get_total_norm, then this (its
        # clip_grad_norm_ calls the private name, so a clip_grad_norm_ is not seen twice).
        with_norm: Callable[..., Any] | None = getattr(utils, "clip_grads_with_norm_", None)

        def seen(parameters: Any) -> list[Any]:
            params = [parameters] if hasattr(parameters, "grad") else list(parameters)
            if not probe.frozen:
                named = [(probe.names[id(p)], None if p.grad is None else p.grad.detach())
                         for p in params if id(p) in probe.names]
                if probe.observe is not None:
                    probe.observe(named)
                else:
                    probe.pre_clip = {name: cpu_copy(g) for name, g in named}
            return params

        def clip_grad_norm_(parameters: Any, max_norm: float, *args: Any, **kwargs: Any) -> Any:
            total = original(seen(parameters), max_norm, *args, **kwargs)
            probe.calls.append({"total_norm": float(total), "max_norm": float(max_norm)})
            return total

        def clip_grads_with_norm_(parameters: Any, max_norm: float, total_norm: Any, *args: Any, **kwargs: Any) -> Any:
            assert with_norm is not None
            out = with_norm(seen(parameters), max_norm, total_norm, *args, **kwargs)
            probe.calls.append({"total_norm": float(total_norm), "max_norm": float(max_norm)})
            return out

        # Both modules: user code reaches the function as torch.nn.utils.clip_grad_norm_ (nanoGPT)
        # or through the submodule; a module attribute is looked up at call time.
        wrappers: list[tuple[Any, str, Callable[..., Any]]] = [
            (owner, "clip_grad_norm_", clip_grad_norm_) for owner in (utils, clip_module)]
        if with_norm is not None:
            wrappers.append((utils, "clip_grads_with_norm_", clip_grads_with_norm_))
        for owner, name, wrapper in wrappers:
            probe._restore.append((owner, name, getattr(owner, name)))
            setattr(owner, name, wrapper)
        for namespace in namespaces:
            for key, value in list(namespace.items()):
                for before, wrapper in ((original, clip_grad_norm_), (with_norm, clip_grads_with_norm_)):
                    if before is not None and value is before:
                        probe._restore.append((namespace, key, value))
                        namespace[key] = wrapper
        return probe

    def engaged(self) -> bool:
        """Did any call actually scale gradients down (total norm above max_norm)?"""
        return any(c["total_norm"] > c["max_norm"] and math.isfinite(c["total_norm"])
                   for c in self.calls)

    def close(self) -> None:
        for owner, key, value in reversed(self._restore):
            if isinstance(owner, dict):
                owner[key] = value
            else:
                setattr(owner, key, value)
        self._restore.clear()


# -- the recorded step's own probes ---------------------------------------------------------


@dataclass
class BatchDigests(Probe):
    """The digest of every step's global batch: every rank draws the *same* global batch from
    the same seed, unless the data it draws from was built differently in this process."""

    out: DataSlice = field(default_factory=lambda: DataSlice(batch_digests=[]))

    def attach(self, stack: contextlib.ExitStack) -> None:
        pass

    def begin_step(self, step: Step) -> None:
        from ...harness.batches import digest

        self.out["batch_digests"].append(digest(step.batch[0]) + digest(step.batch[1]))

    def result(self) -> DataSlice:
        return self.out


@dataclass
class Routing(Probe):
    """Top-k decisions (a mixture of experts' routing) per step (``routing.RoutingProbe``)."""

    probe: RoutingProbe | None = None
    out: RoutingSlice = field(default_factory=lambda: RoutingSlice(routing=[]))

    def attach(self, stack: contextlib.ExitStack) -> None:
        self.probe = stack.enter_context(RoutingProbe.watching())

    def end_step(self, step: Step) -> dict[str, Any]:
        assert self.probe is not None
        self.out["routing"].append(self.probe.take())
        return {}  # the steps are a list in ``result``

    def result(self) -> RoutingSlice:
        return self.out


@dataclass
class CompileWatch(Probe):
    """The step run compiled as the target has it, or eagerly (``eager``), with dynamo's graph
    breaks and DDP's bucket splits measured (``compiled.watch_compile``)."""

    ddp: Any
    inner: Any
    eager: bool
    found: dict[str, Any] = field(default_factory=dict)

    def attach(self, stack: contextlib.ExitStack) -> None:
        self.found = stack.enter_context(watch_compile(self.ddp, self.inner, eager=self.eager))

    def result(self) -> CompileSlice:
        return CompileSlice(compile=self.found or None)


@dataclass
class Features(Probe):
    """Which production features the step uses (autocast, GradScaler, checkpointing…), seen
    while it runs: the report's configuration table (``harness.features``)."""

    ddp: Any
    probe: FeatureProbe | None = None

    def attach(self, stack: contextlib.ExitStack) -> None:
        self.probe = stack.enter_context(FeatureProbe.watching(self.ddp))

    def result(self) -> FeaturesSlice:
        assert self.probe is not None
        return FeaturesSlice(features=self.probe.result())
