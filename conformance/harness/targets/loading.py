"""Load a target and check it at the edge: its names, kinds and signatures, and what its
``build_model`` and ``make_batch`` return.

    load_target("mlp")                    # a built-in, by name
    load_target("path/to/my_target.py")   # a file (its folder importable, as for a script)
    load_target("mypkg.ddp_target")       # an importable module

Everything a user can get wrong here is caught before any check uses it, as a TargetError
whose one-line message says what is wrong and how to fix it.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
import traceback
from dataclasses import replace
from pathlib import Path
from types import ModuleType
from typing import Any

from .._layout import batch_error, declaration_error
from ..batches import is_batch_part
from ..returned import LAYOUTS
from ..target_calls import (
    binds,
    defined_at,
    is_user_file,
    one_line,
    shown_path,
    signature_text,
    source_files,
    takes_keyword,
)
from .errors import SEE, TargetError
from .target import (
    BUILTINS,
    DDP_KWARGS,
    OPTIONAL_CALLABLES,
    REQUIRED,
    SAMPLE_IDENTITIES,
    SAMPLING_MODES,
    Target,
)

_CACHE: dict[str, Target] = {}
#: A spec ending in this is the same target trained through DDP (its ``ddp_kwargs`` and
#: ``configure_ddp``) with its ``parallelize`` set aside: ``--compare-ddp`` runs both.
VIA_DDP = "#ddp"


def _import(spec: str) -> tuple[ModuleType, str, bool]:
    if spec in BUILTINS:
        return importlib.import_module(f"conformance.targets.{spec.replace('-', '_')}"), spec, True
    path = Path(spec)
    if spec.endswith(".py") or path.is_file():
        if not path.is_file():
            raise TargetError(f"target file {spec!r} does not exist; pass a path to a .py file, "
                              f"a module name, or one of {', '.join(BUILTINS)}")
        # As `python train.py` does: the file's folder first on sys.path, so the target can
        # `import model` from beside it (and so can every rank that loads it).
        folder = str(path.resolve().parent)
        if folder not in sys.path:
            sys.path.insert(0, folder)
        # A stable name (not hash(), which is salted per process) so every rank agrees on it.
        # fsencode: a path with bytes that are not UTF-8 (decoded to lone surrogates) hashes too.
        name = "_ddp_target_" + hashlib.sha1(os.fsencode(path.resolve())).hexdigest()[:12]
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
                              f"{exc.msg}; fix the file and run again ({SEE})") from None
        except ModuleNotFoundError as exc:
            sys.modules.pop(name, None)
            raise TargetError(f"importing target file {spec!r} raised {one_line(exc)}; the target's "
                              f"own folder ({folder}) is importable, anything else must be "
                              f"installed or on PYTHONPATH ({SEE})") from None
        except Exception as exc:
            sys.modules.pop(name, None)
            raise TargetError(f"importing target file {spec!r} raised {one_line(exc)}; "
                              f"fix the module-level code ({SEE})") from None
        return module, path.stem, False
    try:
        return importlib.import_module(spec), spec, False
    except ModuleNotFoundError as exc:
        raise TargetError(f"target {spec!r} is not a built-in ({', '.join(BUILTINS)}), a .py file "
                          f"or an importable module ({exc.msg}); check the spelling or the path") from None
    except Exception as exc:
        raise TargetError(f"importing target module {spec!r} raised {one_line(exc)}; fix the "
                          f"module-level code ({SEE})") from None


#: The seed torch's default generator holds while a target is imported: an import that leaves
#: another initial seed seeded torch itself. No user picks it (a fixed 64-bit pattern).
IMPORT_SENTINEL_SEED = 0x6DDC_0F0A_11D5_EED1


def _import_seeded(spec: str) -> tuple[ModuleType, str, bool, Any]:
    """:func:`_import`, and torch's default generator state after it where the import seeded
    torch (``torch.manual_seed`` at module level, the same on every rank unless it adds the
    rank); else None. Told by the initial seed the import leaves: torch is seeded with a
    sentinel for the import, and the state before it is put back where the import did not seed
    (what the rank process had seeded stays as it was). Only where torch was imported before
    (the rank processes): a first import of torch seeds it by itself."""
    torch = sys.modules.get("torch")
    if torch is None:
        return (*_import(spec), None)
    before = torch.random.get_rng_state()
    torch.manual_seed(IMPORT_SENTINEL_SEED)
    try:
        module, name, builtin = _import(spec)
    except BaseException:
        torch.random.set_rng_state(before)
        raise
    if torch.initial_seed() == IMPORT_SENTINEL_SEED:
        torch.random.set_rng_state(before)
        return module, name, builtin, None
    return module, name, builtin, torch.random.get_rng_state()


def load_target(spec: str) -> Target:
    """Import a target and check its names, kinds and signatures (cheap: builds nothing). Cached."""
    if spec in _CACHE:
        return _CACHE[spec]
    if spec.endswith(VIA_DDP):
        base = load_target(spec[:-len(VIA_DDP)])
        _CACHE[spec] = replace(base, spec=spec, name=f"{base.name} (via DDP)", parallelize=None)
        return _CACHE[spec]
    module, name, builtin, import_rng_state = _import_seeded(spec)
    found: dict[str, Any] = {}
    for attr in REQUIRED:
        value = getattr(module, attr, None)
        if value is None:
            raise TargetError(f"target {name!r} does not define {attr}(); add a module-level "
                              f"function {attr} ({SEE})")
        if not callable(value):
            raise TargetError(f"target {name!r}: {attr} is a {type(value).__name__}, not a function "
                              f"({SEE})")
        found[attr] = value
    for attr in OPTIONAL_CALLABLES:
        value = getattr(module, attr, None)
        if value is not None:
            if not callable(value):
                raise TargetError(f"target {name!r}: {attr} is a {type(value).__name__}, not a "
                                  f"function ({SEE})")
            found[attr] = value
    if "loss_fn" not in found and "forward_loss" not in found:
        raise TargetError(f"target {name!r} does not define loss_fn(); add a module-level function "
                          f"loss_fn(outputs, targets), or forward_loss(model, microbatch) for a "
                          f"model that computes its loss in forward ({SEE})")
    _check_signatures(name, found)
    ddp_kwargs = getattr(module, "ddp_kwargs", {})
    if not isinstance(ddp_kwargs, dict):
        raise TargetError(f"target {name!r}: ddp_kwargs is a {type(ddp_kwargs).__name__}, "
                          f"it must be a dict such as {{'find_unused_parameters': False}} ({SEE})")
    unknown = sorted(set(ddp_kwargs) - set(DDP_KWARGS))
    if unknown:
        raise TargetError(f"target {name!r}: ddp_kwargs has unknown DDP argument(s) {unknown}; "
                          f"allowed: {', '.join(DDP_KWARGS)} ({SEE})")
    batch_size = getattr(module, "global_batch_size", None)
    if batch_size is not None and (not isinstance(batch_size, int) or isinstance(batch_size, bool)
                                   or batch_size < 1):
        raise TargetError(f"target {name!r}: global_batch_size={batch_size!r} must be a positive int "
                          f"({SEE})")
    sampling = _choice(module, name, "sampling", SAMPLING_MODES)
    identity = _choice(module, name, "sample_identity", SAMPLE_IDENTITIES)
    repeats = _repeats(module, name, sampling)
    batch_dim = getattr(module, "batch_dim", None)
    wrong = declaration_error(batch_dim)
    if wrong is not None:
        raise TargetError(f"target {name!r}: {wrong} ({SEE})")
    target = Target(name=name, spec=spec, module=module, ddp_kwargs=dict(ddp_kwargs),
                    builtin=builtin, global_batch_size=batch_size, sampling=sampling, sampling_repeats=repeats,
                    sample_identity=identity, batch_dim=batch_dim, user_files=_user_files(module, found),
                    user_dir=_user_dir(module), import_rng_state=import_rng_state, **found)
    _CACHE[spec] = target
    return target


def _choice(module: ModuleType, name: str, attr: str, allowed: tuple[str, ...]) -> str:
    value = getattr(module, attr, allowed[0])
    if value not in allowed:
        raise TargetError(f"target {name!r}: {attr} = {value!r} is not one of "
                          f"{', '.join(repr(a) for a in allowed)} ({SEE})")
    return str(value)


def _repeats(module: ModuleType, name: str, sampling: str) -> int | None:
    """``sampling_repeats``: required with ``sampling = "repeated"`` (an int >= 2), refused without."""
    value = getattr(module, "sampling_repeats", None)
    if sampling != "repeated":
        if value is not None:
            raise TargetError(f"target {name!r}: sampling_repeats = {value!r} applies only with "
                              f"sampling = 'repeated' (repeated augmentation) ({SEE})")
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 2:
        raise TargetError(f"target {name!r}: sampling = 'repeated' needs sampling_repeats = r, how many "
                          f"times each sample is drawn per epoch (an int >= 2), not {value!r} ({SEE})")
    return value


def _user_files(module: ModuleType, found: dict[str, Any]) -> frozenset[str]:
    own = getattr(module, "__file__", None)
    files = source_files(found.values())
    return files | {os.path.realpath(own)} if own else files


def _user_dir(module: ModuleType) -> str | None:
    own = getattr(module, "__file__", None)
    return os.path.dirname(os.path.realpath(own)) if own else None


# Every function's accepted call shapes: (positional counts accepted, keywords it may be given).
_SIGNATURES: dict[str, tuple[str, tuple[int, ...]]] = {
    "build_model": ("build_model()", (0,)),
    "make_batch": ("make_batch(generator, batch_size)", (2,)),
    "loss_fn": ("loss_fn(outputs, targets)", (2,)),
    "forward_loss": ("forward_loss(model, microbatch)", (2,)),
    "build_optimizer": ("build_optimizer(model) or build_optimizer(params)", (1,)),
    "train_step": ("train_step(model, optimizer, microbatches, loss_fn) — loss_fn and a `step` "
                   "keyword are optional", (3, 4)),
    "epoch_batches": ("epoch_batches(rank, world_size, epoch)", (3,)),
    "run_loop": ("run_loop(ctx)", (1,)),
    "configure_ddp": ("configure_ddp(ddp_model)", (1,)),
    "evaluate": ("evaluate(model, ctx)", (2,)),
    "parallelize": ("parallelize(model, ctx)", (2,)),
}


def _check_signatures(name: str, found: dict[str, Any]) -> None:
    """Refuse a function that cannot be called the way the suite calls it, before any process
    starts: a wrong signature would otherwise raise inside the suite's own call, where nothing
    points at the user's line."""
    for attr, fn in found.items():
        wanted, counts = _SIGNATURES[attr]
        keywords = ("step",) if attr == "train_step" and takes_keyword(fn, "step") else ()
        if not any(binds(fn, n, keywords=keywords) for n in counts):
            raise TargetError(f"target {name!r}: {attr} must be callable as {wanted}, its "
                              f"signature is {signature_text(fn)} (at {defined_at(fn)}; {SEE})")


def _user_line(target: Target, exc: BaseException) -> str:
    """``file:line`` of the innermost frame of the user's code in ``exc``'s traceback (the
    innermost frame at all when none is theirs)."""
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if is_user_file(f.filename, target.user_files, target.user_dir)]
    frame = (mine or frames)[-1]
    return f"{shown_path(frame.filename)}:{frame.lineno}"


def build_model_checked(target: Target) -> Any:
    """``target.build_model()`` with its failure turned into a TargetError."""
    import torch

    try:
        model = target.build_model()
    except Exception as exc:
        raise TargetError(f"target {target.name!r}: build_model() raised {one_line(exc)} "
                          f"(at {_user_line(target, exc)}); fix the model constructor ({SEE})") from None
    if not isinstance(model, torch.nn.Module):
        raise TargetError(f"target {target.name!r}: build_model() returned a {type(model).__name__}, "
                          f"not a torch.nn.Module ({SEE})")
    return model


def make_batch_checked(target: Target, generator: Any, batch_size: int) -> tuple[Any, Any]:
    """``target.make_batch(generator, batch_size)``, checked: (inputs, targets), each a tensor
    or a tuple/list/dict of tensors (``harness.batches``), every tensor holding batch_size
    samples on dim 0, or on the dimension the target's ``batch_dim`` declares for it."""
    try:
        batch = target.make_batch(generator, batch_size)
    except Exception as exc:
        raise TargetError(f"target {target.name!r}: make_batch(generator, {batch_size}) raised "
                          f"{one_line(exc)} (at {_user_line(target, exc)}; {SEE})") from None
    if not (isinstance(batch, (tuple, list)) and len(batch) == 2):
        raise TargetError(f"target {target.name!r}: make_batch must return (inputs, targets), "
                          f"got {type(batch).__name__} ({SEE})")
    for part, value in zip(("inputs", "targets"), batch):
        if not is_batch_part(value):
            raise TargetError(f"target {target.name!r}: make_batch returned {part} of type "
                              f"{type(value).__name__}; inputs and targets must each be a tensor, or "
                              f"a tuple/list/dict of tensors ({SEE})")
    wrong = batch_error((batch[0], batch[1]), target.batch_dim, batch_size)
    if wrong is not None:
        raise TargetError(f"target {target.name!r}: make_batch(generator, {batch_size}) {wrong} ({SEE})")
    LAYOUTS.note(target.spec, (batch[0], batch[1]), target.batch_dim)
    return batch[0], batch[1]
