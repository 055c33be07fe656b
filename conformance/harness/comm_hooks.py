"""The one comm hook of a DDP model, shared by the target and the suite.

DDP accepts exactly one comm hook per model: a second ``register_comm_hook`` (or
``_register_builtin_comm_hook``) raises "... can only be called once". Production registers its
own right after wrapping (fp16/bf16 compression, PowerSGD) — in a target, in
``configure_ddp(ddp_model)`` (README, "Writing a target"); the suite registers its own to
*observe* the bucket all-reduces (``observe.comm_rounds`` counts rounds, faults' collective
tracker records enqueue/complete). Both must hold at once, so the hook DDP gets is a chain:

    suite layer 1 → suite layer 2 → … → the target's hook (its state, its compression)
                                         or the stock ``allreduce_hook`` when it has none

A layer is ``layer(bucket, reduce) -> Future[Tensor]``: it observes the bucket and calls
``reduce(bucket)`` to pass it on (it may chain on the future). While ``configure_ddp`` runs,
the DDP object's ``register_comm_hook`` and ``_register_builtin_comm_hook`` are replaced on that
one instance by a capture (:func:`capturing`); what it captured becomes the chain's innermost
reduce (:func:`install_user_hook`). The chain is registered on DDP only when someone needs it
(a captured hook, or the suite's first layer), so a target without a hook under a check without
instrumentation keeps DDP's built-in all-reduce exactly.
"""

from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

#: ``reduce(bucket) -> Future[Tensor]``: the rest of the chain.
Reduce = Callable[[Any], Any]
#: ``layer(bucket, reduce) -> Future[Tensor]``: one observer of the suite.
Layer = Callable[[Any, Reduce], Any]

#: DDP's own message for a second registration, kept so a target that registers twice reads
#: what it would read without the suite.
ONCE = "register_comm_hook or register_builtin_comm_hook can only be called once"


@dataclass(frozen=True)
class UserHook:
    """A comm hook the target registered in ``configure_ddp``: DDP would call ``hook(state, bucket)``."""

    state: Any
    hook: Callable[[Any, Any], Any]
    name: str  # for the report: "fp16_compress_hook", "builtin FP16_COMPRESS"


@dataclass
class _Chain:
    """What DDP's one registered hook runs. Mutable on purpose: layers are added after
    registration (DDP never sees a second hook), always before the first backward."""

    process_group: Any
    user: UserHook | None = None
    layers: list[Layer] = field(default_factory=list)

    def reduce(self, bucket: Any) -> Any:
        if self.user is not None:
            return self.user.hook(self.user.state, bucket)
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        # Divide by the world size, then all-reduce: DDP's own mean, in another summation order.
        return default_hooks.allreduce_hook(self.process_group, bucket)

    def run(self, bucket: Any, index: int = 0) -> Any:
        if index == len(self.layers):
            return self.reduce(bucket)
        return self.layers[index](bucket, lambda b: self.run(b, index + 1))


# Keyed weakly by the DDP object: a model the rank drops takes its chain along.
_CHAINS: weakref.WeakKeyDictionary[Any, _Chain] = weakref.WeakKeyDictionary()


def ddp_of(model: Any) -> Any:
    """The DDP object itself, also when the target's ``configure_ddp`` returned a module around
    it (``torch.compile(ddp_model)`` keeps it as ``_orig_mod``)."""
    inner = getattr(model, "_orig_mod", None)
    return model if inner is None else inner


def _chain(ddp_model: Any) -> _Chain:
    ddp = ddp_of(ddp_model)
    chain = _CHAINS.get(ddp)
    if chain is None:
        chain = _Chain(process_group=getattr(ddp, "process_group", None))

        # Deliberately unannotated: DDP inspects the hook's signature and rejects a ``bucket``
        # annotation other than dist.GradBucket (and postponed annotations are strings).
        def hook(state, bucket):  # type: ignore[no-untyped-def]
            return chain.run(bucket)

        ddp.register_comm_hook(state=None, hook=hook)
        _CHAINS[ddp] = chain
    return chain


def add_layer(ddp_model: Any, layer: Layer) -> None:
    """Observe every bucket all-reduce of ``ddp_model`` with ``layer`` (layers run in the order
    added, the target's hook or the stock all-reduce last). Call before the first backward."""
    _chain(ddp_model).layers.append(layer)


def user_hook(ddp_model: Any) -> UserHook | None:
    """The hook the target registered in ``configure_ddp``, if any."""
    chain = _CHAINS.get(ddp_of(ddp_model))
    return None if chain is None else chain.user


def install_user_hook(ddp_model: Any, captured: UserHook) -> None:
    """Make ``captured`` the innermost reduce of the model's chain (registering the chain)."""
    _chain(ddp_model).user = captured


def _builtin(ddp: Any, comm_hook_type: Any) -> UserHook:
    """A built-in (C++) comm hook as its Python twin, so it can sit inside the chain."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    name = getattr(comm_hook_type, "name", str(comm_hook_type))
    twins = {"ALLREDUCE": default_hooks.allreduce_hook, "FP16_COMPRESS": default_hooks.fp16_compress_hook}
    if name not in twins:
        raise ValueError(f"built-in comm hook {name} is not one of {sorted(twins)}; register its "
                         f"Python hook with register_comm_hook instead")
    return UserHook(state=ddp.process_group, hook=twins[name], name=f"builtin {name}")


@contextlib.contextmanager
def capturing(ddp: Any, *, refuse: Callable[[str], BaseException]) -> Iterator[list[UserHook]]:
    """While the block runs, ``ddp.register_comm_hook(state, hook)`` and
    ``ddp._register_builtin_comm_hook(type)`` record the hook instead of registering it.

    Only this instance is patched (instance attributes shadow DDP's methods), and both are put
    back however the block ends. A second registration raises ``refuse(message)`` with DDP's
    own wording. DDP's signature check still runs on the captured hook, as it would.
    """
    captured: list[UserHook] = []

    def keep(hook: UserHook) -> None:
        if captured:
            raise refuse(f"{ONCE} (a second hook, {hook.name}, after {captured[0].name})")
        captured.append(hook)

    def register_comm_hook(state: Any, hook: Callable[[Any, Any], Any]) -> None:
        check = getattr(ddp, "_check_comm_hook", None)
        if check is not None:
            check(hook)
        keep(UserHook(state=state, hook=hook, name=getattr(hook, "__name__", type(hook).__name__)))

    def register_builtin(comm_hook_type: Any) -> None:
        keep(_builtin(ddp, comm_hook_type))

    patched = {"register_comm_hook": register_comm_hook, "_register_builtin_comm_hook": register_builtin}
    for name, fn in patched.items():
        object.__setattr__(ddp, name, fn)
    try:
        yield captured
    finally:
        for name in patched:
            ddp.__dict__.pop(name, None)
