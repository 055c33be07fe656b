"""Load and validate a target: the user's model, data, loss, optimizer and training code.

    load_target("mlp")                    # a built-in, by name
    load_target("path/to/my_target.py")   # a file
    load_target("mypkg.ddp_target")       # an importable module

The names a target defines are the public contract written down in the README section 'Writing a target'. Everything a user can
get wrong is caught here, at the edge, as a TargetError whose one-line message says what is
wrong and how to fix it; the CLI turns it into exit code 2.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

BUILTINS = ("mlp", "tied-lm", "branchy", "convbn")
REQUIRED = ("build_model", "make_batch", "loss_fn")
OPTIONAL_CALLABLES = ("build_optimizer", "train_step", "epoch_batches", "run_loop")
# DDP constructor arguments a target may set; anything else is a typo that DDP would reject
# only later, inside a rank process, with a less helpful message.
DDP_KWARGS = ("find_unused_parameters", "bucket_cap_mb", "static_graph", "gradient_as_bucket_view",
              "broadcast_buffers", "forward_sync_buffers", "init_sync", "check_reduction",
              "process_group", "mixed_precision")


class TargetError(ValueError):
    """The target cannot be used as written. The message is one line: what and how to fix."""


def default_build_optimizer(params: Any) -> Any:
    import torch

    return torch.optim.SGD(params, lr=0.1)


def default_train_step(model: Any, optimizer: Any, microbatches: list[tuple[Any, Any]],
                       loss_fn: Callable[[Any, Any], Any]) -> None:
    """The textbook DDP step: no_sync on all but the last microbatch, loss divided by K."""
    import contextlib

    optimizer.zero_grad(set_to_none=True)
    k = len(microbatches)
    for i, (inputs, targets) in enumerate(microbatches):
        # Only the last backward of the window may all-reduce; the others just accumulate.
        sync = contextlib.nullcontext() if i == k - 1 or not hasattr(model, "no_sync") else model.no_sync()
        with sync:
            loss = loss_fn(model(inputs), targets) / k
            loss.backward()
    optimizer.step()


@dataclass(frozen=True)
class Target:
    """A loaded target. ``spec`` is what rank processes pass to load_target to get it back."""

    name: str
    spec: str
    module: ModuleType
    build_model: Callable[[], Any]
    make_batch: Callable[[Any, int], Any]
    loss_fn: Callable[[Any, Any], Any]
    build_optimizer: Callable[[Any], Any] = default_build_optimizer
    train_step: Callable[..., None] = default_train_step
    ddp_kwargs: dict[str, Any] = field(default_factory=dict)
    epoch_batches: Callable[[int, int, int], Any] | None = None
    run_loop: Callable[[Any], None] | None = None
    builtin: bool = False
    global_batch_size: int | None = None  # optional extension: the production global batch

    def batch_size_for(self, world_size: int, microbatches: int = 1) -> int:
        """The global batch a check uses: the target's own, or 4 samples per microbatch per rank.

        Raises TargetError when the target's batch cannot be split evenly (the README's 'Writing a target' splits
        it into world_size contiguous chunks, each into K microbatches).
        """
        unit = world_size * microbatches
        if self.global_batch_size is None:
            return 4 * unit
        if self.global_batch_size % unit:
            raise TargetError(f"target {self.name!r}: global_batch_size={self.global_batch_size} is "
                              f"not divisible by world_size={world_size} x microbatches={microbatches}; "
                              f"use a multiple of {unit}")
        return self.global_batch_size


_CACHE: dict[str, Target] = {}


def _import(spec: str) -> tuple[ModuleType, str, bool]:
    if spec in BUILTINS:
        return importlib.import_module(f"conformance.targets.{spec.replace('-', '_')}"), spec, True
    path = Path(spec)
    if spec.endswith(".py") or path.is_file():
        if not path.is_file():
            raise TargetError(f"target file {spec!r} does not exist; pass a path to a .py file, "
                              f"a module name, or one of {', '.join(BUILTINS)}")
        # A stable name (not hash(), which is salted per process) so every rank agrees on it.
        name = "_ddp_target_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
        module_spec = importlib.util.spec_from_file_location(name, path)
        if module_spec is None or module_spec.loader is None:
            raise TargetError(f"target file {spec!r} cannot be imported as Python")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module  # dataclasses and pickling look the module up by name
        try:
            module_spec.loader.exec_module(module)
        except SyntaxError as exc:
            sys.modules.pop(name, None)
            raise TargetError(f"target file {spec!r} has a syntax error at line {exc.lineno}: "
                              f"{exc.msg}; fix the file and run again") from None
        except Exception as exc:
            sys.modules.pop(name, None)
            raise TargetError(f"importing target file {spec!r} raised {_one_line(exc)}; "
                              f"fix the module-level code") from None
        return module, path.stem, False
    try:
        return importlib.import_module(spec), spec, False
    except ModuleNotFoundError as exc:
        raise TargetError(f"target {spec!r} is not a built-in ({', '.join(BUILTINS)}), a .py file "
                          f"or an importable module ({exc.msg}); check the spelling or the path") from None
    except Exception as exc:
        raise TargetError(f"importing target module {spec!r} raised {_one_line(exc)}") from None


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def load_target(spec: str) -> Target:
    """Import a target and check its names and kinds (cheap: builds nothing). Cached."""
    if spec in _CACHE:
        return _CACHE[spec]
    module, name, builtin = _import(spec)
    found: dict[str, Any] = {}
    for attr in REQUIRED:
        value = getattr(module, attr, None)
        if value is None:
            raise TargetError(f"target {name!r} does not define {attr}(); add a module-level "
                              f"function {attr} (see the README section 'Writing a target')")
        if not callable(value):
            raise TargetError(f"target {name!r}: {attr} is a {type(value).__name__}, not a function")
        found[attr] = value
    for attr in OPTIONAL_CALLABLES:
        value = getattr(module, attr, None)
        if value is not None:
            if not callable(value):
                raise TargetError(f"target {name!r}: {attr} is a {type(value).__name__}, not a function")
            found[attr] = value
    ddp_kwargs = getattr(module, "ddp_kwargs", {})
    if not isinstance(ddp_kwargs, dict):
        raise TargetError(f"target {name!r}: ddp_kwargs is a {type(ddp_kwargs).__name__}, "
                          f"it must be a dict such as {{'find_unused_parameters': False}}")
    unknown = sorted(set(ddp_kwargs) - set(DDP_KWARGS))
    if unknown:
        raise TargetError(f"target {name!r}: ddp_kwargs has unknown DDP argument(s) {unknown}; "
                          f"allowed: {', '.join(DDP_KWARGS)}")
    batch_size = getattr(module, "global_batch_size", None)
    if batch_size is not None and (not isinstance(batch_size, int) or isinstance(batch_size, bool)
                                   or batch_size < 1):
        raise TargetError(f"target {name!r}: global_batch_size={batch_size!r} must be a positive int")
    _check_arity(name, "make_batch", found["make_batch"], 2)
    _check_arity(name, "loss_fn", found["loss_fn"], 2)
    target = Target(name=name, spec=spec, module=module, ddp_kwargs=dict(ddp_kwargs),
                    builtin=builtin, global_batch_size=batch_size, **found)
    _CACHE[spec] = target
    return target


def _check_arity(name: str, attr: str, fn: Callable[..., Any], n: int) -> None:
    try:
        inspect.signature(fn).bind(*range(n))
    except TypeError:
        raise TargetError(f"target {name!r}: {attr} must accept {n} positional arguments "
                          f"(see the README section 'Writing a target'), its signature is {attr}{inspect.signature(fn)}") from None
    except ValueError:  # builtins without a signature: let the call decide
        pass


def build_model_checked(target: Target) -> Any:
    """``target.build_model()`` with its failure turned into a TargetError."""
    import torch

    try:
        model = target.build_model()
    except Exception as exc:
        where = traceback.extract_tb(exc.__traceback__)[-1]
        raise TargetError(f"target {target.name!r}: build_model() raised {_one_line(exc)} "
                          f"(at {Path(where.filename).name}:{where.lineno}); fix the model "
                          f"constructor") from None
    if not isinstance(model, torch.nn.Module):
        raise TargetError(f"target {target.name!r}: build_model() returned a {type(model).__name__}, "
                          f"not a torch.nn.Module")
    return model


def make_batch_checked(target: Target, generator: Any, batch_size: int) -> tuple[Any, Any]:
    """``target.make_batch(generator, batch_size)``, checked: two tensors of batch_size rows."""
    import torch

    try:
        batch = target.make_batch(generator, batch_size)
    except Exception as exc:
        raise TargetError(f"target {target.name!r}: make_batch(generator, {batch_size}) raised "
                          f"{_one_line(exc)}") from None
    if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
        raise TargetError(f"target {target.name!r}: make_batch must return (inputs, targets), "
                          f"got {type(batch).__name__}")
    for part, value in zip(("inputs", "targets"), batch):
        if not isinstance(value, torch.Tensor):
            raise TargetError(f"target {target.name!r}: make_batch returned {part} of type "
                              f"{type(value).__name__}; both inputs and targets must be tensors")
        if value.dim() == 0 or value.shape[0] != batch_size:
            raise TargetError(f"target {target.name!r}: make_batch(generator, {batch_size}) returned "
                              f"{part} with shape {tuple(value.shape)}; dim 0 must be the batch size "
                              f"{batch_size}")
    return batch[0], batch[1]
