"""The rank side's observers of the node-health work: every value offered to a fault, then digested.

Four probes of the one observation contract (``conformance.harness.observe``), attached in
this order so that a digest sees what the (possibly faulty) device produced:

- :class:`TensorSites` offers each value as it is computed to the check's fault (a "tensor"
  site, ``faults/sites.py``): every module's output from a forward hook, every parameter's
  gradient once it is accumulated. Without a fault it changes nothing.
- :class:`ComputeDigests` digests the same values (``digests.digest``), in computation order,
  and holds them for the step so that the one tensor where ranks first differ can be fetched.
- :class:`ComputeClock` times the rank's own compute: from its module's forward (after DDP's
  own pre-forward synchronisation) to its last gradient accumulated (before DDP's final wait
  for the all-reduce), and offers the "step" site to the fault inside that window;
- :class:`BucketDigests` is a layer of the DDP model's comm hook chain
  (``conformance.harness.comm_hooks``): each bucket's all-reduced result, offered to the fault
  and digested, with the names of its parameters, every step.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, TypedDict

from conformance.harness.digest import digest
from conformance.harness.observe import Probe, Slice, Step, unseen

from ..._log import InjectionLog
from ...sites import NO_FAULT, Fault, Site
from .digests import leaves

#: The name of the whole model's output (a module's name is "" at the root).
ROOT = "(model)"


def _modules(model: Any) -> list[tuple[str, Any]]:
    return [(name or ROOT, module) for name, module in model.named_modules()]


@dataclass
class TensorSites(Probe):
    """Each module output and parameter gradient offered to ``fault`` as a "tensor" site."""

    model: Any
    fault: Fault = NO_FAULT
    rank: int = 0
    log: InjectionLog = field(default_factory=InjectionLog)
    step: int = 0

    def attach(self, stack: contextlib.ExitStack) -> None:
        for name, module in _modules(self.model):
            stack.callback(module.register_forward_hook(unseen(self._output_hook(name))).remove)
        for name, param in self.model.named_parameters():
            if param.requires_grad:
                stack.callback(param.register_post_accumulate_grad_hook(self._grad_hook(name)).remove)

    def begin_step(self, step: Step) -> None:
        self.step = step.index

    def _offer(self, label: str, phase: str, tensor: Any) -> Any:
        site = Site("tensor", self.rank, self.step, phase, self.log, label=label, tensor=tensor)
        self.fault.inject(site)
        return site.tensor

    def _output_hook(self, name: str) -> Any:
        import torch

        def hook(module: Any, args: Any, output: Any) -> Any:
            if isinstance(output, torch.Tensor):
                new = self._offer(f"output:{name}", "forward", output)
                return None if new is output else new
            if isinstance(output, (tuple, list)):
                items = [self._offer(f"output:{name}[{i}]", "forward", v) if isinstance(v, torch.Tensor) else v
                         for i, v in enumerate(output)]
                if any(a is not b for a, b in zip(items, output)):
                    return type(output)(items)
            return None

        return hook

    def _grad_hook(self, name: str) -> Any:
        import torch

        def hook(param: Any) -> None:
            new = self._offer(f"grad:{name}", "backward", param.grad)
            if new is not param.grad:
                with torch.no_grad():
                    param.grad.copy_(new)

        return hook


class DigestSlice(TypedDict):
    """One step's digests, in computation order: each tensor's name and digest."""

    names: list[str]
    digests: list[str]


@dataclass
class ComputeDigests(Probe):
    """Digests of every module output (forward order), then of what :meth:`record` is given
    (the input, the loss), and of every gradient (backward order); the step's tensors are held
    (:attr:`held`) until the next step begins. ``copy_grads``: hold a copy of each gradient, as
    it was accumulated (under DDP, whose all-reduce then overwrites ``.grad`` with the average),
    into a buffer kept across steps (:attr:`_copies`)."""

    model: Any
    copy_grads: bool = False
    names: list[str] = field(default_factory=list)
    digests: list[str] = field(default_factory=list)
    held: dict[str, Any] = field(default_factory=dict)
    _calls: dict[str, int] = field(default_factory=dict)
    # One buffer per gradient, allocated at the first step and written over at the next: a fresh
    # clone each step faulted in the model's size of new pages every repeat (0.37 s for 400 MB
    # on a loaded host, against 0.05 s to copy into pages already there).
    _copies: dict[str, Any] = field(default_factory=dict)

    def attach(self, stack: contextlib.ExitStack) -> None:
        for name, module in _modules(self.model):
            stack.callback(module.register_forward_hook(unseen(self._output_hook(name))).remove)
        for name, param in self.model.named_parameters():
            if param.requires_grad:
                stack.callback(param.register_post_accumulate_grad_hook(
                    lambda p, name=name: self.record(f"grad:{name}", p.grad)).remove)
        stack.callback(self.held.clear)
        stack.callback(self._copies.clear)

    def begin_step(self, step: Step) -> None:
        self.names, self.digests, self.held, self._calls = [], [], {}, {}

    def record(self, name: str, value: Any) -> None:
        """Digest every tensor in ``value`` under ``name`` (a module called twice: ``name#2``)."""
        calls = self._calls[name] = self._calls.get(name, 0) + 1
        label = name if calls == 1 else f"{name}#{calls}"
        for leaf, tensor in leaves(value, label):
            self.names.append(leaf)
            self.digests.append(digest(tensor))
            copy = self.copy_grads and leaf.startswith("grad:")
            self.held[leaf] = self._copy(leaf, tensor.detach()) if copy else tensor.detach()

    def _copy(self, leaf: str, tensor: Any) -> Any:
        kept = self._copies.get(leaf)
        if kept is None or kept.shape != tensor.shape or kept.dtype != tensor.dtype or kept.device != tensor.device:
            kept = self._copies[leaf] = tensor.clone()
        else:
            kept.copy_(tensor)
        return kept

    def release(self) -> None:
        """Let go of everything held but the gradients (which ``.grad`` keeps anyway): the
        forward's values, once compared, are not kept alive through the backward."""
        self.held = {k: v for k, v in self.held.items() if k.startswith("grad:")}

    def _output_hook(self, name: str) -> Any:
        def hook(module: Any, args: Any, output: Any) -> None:
            self.record(f"output:{name}", output)

        return hook

    def end_step(self, step: Step) -> DigestSlice:
        return DigestSlice(names=list(self.names), digests=list(self.digests))


class ClockSlice(TypedDict):
    """When this step's compute began (its module's forward) and its last gradient was
    accumulated, in ``time.perf_counter`` seconds (None: no gradient)."""

    compute_began: float | None
    last_gradient: float | None


@dataclass
class ComputeClock(Probe):
    """The instants that bound this rank's own compute in a step, waits for other ranks left out
    (module docstring); the "step" site at "forward" is offered to ``fault`` first, inside the
    window (a :class:`~faults.injectors.SlowRank` slows it there)."""

    model: Any
    fault: Fault = NO_FAULT
    rank: int = 0
    log: InjectionLog = field(default_factory=InjectionLog)
    device: Any = None
    step: int = 0
    began: float | None = None
    last: float | None = None

    def attach(self, stack: contextlib.ExitStack) -> None:
        stack.callback(self.model.register_forward_pre_hook(unseen(self._forward)).remove)
        for param in self.model.parameters():
            if param.requires_grad:
                stack.callback(param.register_post_accumulate_grad_hook(self._accumulated).remove)

    def begin_step(self, step: Step) -> None:
        self.step, self.began, self.last = step.index, None, None

    def _forward(self, module: Any, args: Any) -> None:
        if self.began is not None:
            return  # a second forward in the step: the window is already open
        from conformance.harness.ddp import sync_device

        # Work still queued on the device belongs to what came before (DDP's buffer broadcast).
        sync_device(self.device)
        self.began = time.perf_counter()
        self.fault.inject(Site("step", self.rank, self.step, "forward", self.log, device=self.device))

    def _accumulated(self, param: Any) -> None:
        self.last = time.perf_counter()

    def end_step(self, step: Step) -> ClockSlice:
        return ClockSlice(compute_began=self.began, last_gradient=self.last)


class BucketSlice(TypedDict):
    """The all-reduced buckets, by index: digest and parameter names."""

    buckets: list[dict[str, Any]]


@dataclass
class BucketDigests(Probe):
    """Each DDP bucket's all-reduced result, offered to ``fault`` and then digested.

    ``keep_local``: then the bucket's local gradients, still in ``.grad`` (DDP copied them into
    the bucket, ``gradient_as_bucket_view=False``), are written back over the reduced values,
    so DDP's copy of the result into ``.grad`` leaves every rank its own local gradients: a
    differing gradient's elements can be fetched after the backward without a copy of every
    gradient (one model's worth of memory) kept aside. Nothing reads the averaged ``.grad``:
    the reduced values are digested before they are written over, and no optimizer steps."""

    ddp: Any
    fault: Fault = NO_FAULT
    rank: int = 0
    log: InjectionLog = field(default_factory=InjectionLog)
    keep_local: bool = False
    step: int = 0
    seen: list[dict[str, Any]] = field(default_factory=list)

    def attach(self, stack: contextlib.ExitStack) -> None:
        from conformance.harness.comm_hooks import add_layer

        names = {id(p): n for n, p in self.ddp.module.named_parameters()}

        def layer(bucket: Any, reduce: Any) -> Any:
            params = bucket.parameters()
            index = bucket.index()
            # Where each parameter's gradient sits in the bucket, read before the reduce (a
            # comm hook may hand DDP another tensor of the bucket's shape).
            local = _local_slots(bucket, params) if self.keep_local else []
            labels = [names.get(id(p), "?") for p in params]
            return reduce(bucket).then(lambda fut: self._reduced(index, labels, fut.value(), local))

        # DDP takes one comm hook, before the first backward: a layer of its chain, kept for the
        # model's life (the model is this check's own, built for this call).
        add_layer(self.ddp, layer)

    def begin_step(self, step: Step) -> None:
        self.step, self.seen = step.index, []

    def _reduced(self, index: int, params: list[str], value: Any, local: list[_Slot]) -> Any:
        import torch

        tensor = value[0] if isinstance(value, (list, tuple)) else value
        site = Site("tensor", self.rank, self.step, "backward", self.log, label=f"bucket:{index}", tensor=tensor)
        self.fault.inject(site)
        if site.tensor is not tensor:
            tensor.copy_(site.tensor)
        self.seen.append({"index": index, "digest": digest(tensor), "parameters": params})
        with torch.no_grad():
            for size, stride, offset, param in local:
                # Every gradient of this bucket was accumulated before DDP launched it, and
                # nothing writes .grad again until DDP copies this result into it.
                if param.grad is not None:
                    tensor.as_strided(size, stride, tensor.storage_offset() + offset).copy_(param.grad)
        return tensor

    def end_step(self, step: Step) -> BucketSlice:
        return BucketSlice(buckets=sorted(self.seen, key=lambda b: b["index"]))


def keeps_grads_apart(ddp: Any) -> bool:
    """Whether DDP keeps every ``.grad`` apart from its buckets, dense (what
    :class:`BucketDigests`' ``keep_local`` needs): not ``gradient_as_bucket_view``, where ``.grad``
    is the bucket itself, and no sparse gradient (an embedding with ``sparse=True``: DDP hands
    it to the comm hook as it is)."""
    import torch

    sparse = any(isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag)) and m.sparse for m in ddp.module.modules())
    return not getattr(ddp, "gradient_as_bucket_view", False) and not sparse


#: Where one parameter's gradient sits in its bucket: size, stride, offset from the bucket's
#: start (in elements), and the parameter.
_Slot = tuple[tuple[int, ...], tuple[int, ...], int, Any]


def _local_slots(bucket: Any, params: list[Any]) -> list[_Slot]:
    """Per parameter of ``bucket``, its gradient's place in the bucket (not the views: they
    would keep a bucket DDP replaces alive until the reduce completes)."""
    start = bucket.buffer().storage_offset()
    return [(tuple(v.size()), tuple(v.stride()), v.storage_offset() - start, p)
            for v, p in zip(bucket.gradients(), params)]
