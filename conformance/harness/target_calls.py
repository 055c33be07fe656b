"""Calling the user's code: reading its signatures, and telling its own exceptions from DDP's.

A target is the user's code, and the suite calls it from inside rank processes. When that code
raises — a ``TypeError`` in ``train_step``, an ``AttributeError`` in ``build_optimizer``, a
shape mismatch in ``loss_fn`` — the user wants one line naming *their* function and line, and
exit code 2; not a failed check with DDP advice. When DDP itself raises on the user's model
("Expected to have finished reduction…"), that *is* the finding and must stay one.

:func:`blame` decides which is which from the traceback alone:

- the innermost frame of the user's code (the target file, any file in its folder, or the
  file a target function was defined in) must exist;
- no frame *below* it (deeper in the call) may be DDP's or torch.distributed's code, or the
  suite's own (its hooks and injected faults are not the user's);
- the message must not be one of DDP's errors raised from C++ (they have no Python frame of
  their own to tell them apart, e.g. "Expected to mark a variable ready only once").

Library frames below the user's line (``torch.nn.functional`` raising on mismatched shapes)
are allowed: the user's line passed the wrong thing, and that line is what the message cites.
"""

from __future__ import annotations

import functools
import inspect
import os
import site
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable

_HERE = Path(__file__).resolve()
#: The suite's own packages: a frame there is the harness, a check, a fault or a report —
#: never the user's, except the built-in targets (which are plain target files).
# faults/ and reports/ in both layouts: the folders themselves (a source checkout, which the
# packaging maps to ddp_conformance.*) and ddp_conformance/ (where a wheel installs them), that
# one also unresolved (a frame carries the path its module was imported by).
_SUITE_DIRS = tuple(str(p) for p in (_HERE.parents[1], _HERE.parents[2] / "faults",
                                     _HERE.parents[2] / "reports", _HERE.parents[2] / "ddp_conformance",
                                     Path(__file__).parents[2] / "ddp_conformance"))
_BUILTIN_TARGETS = str(_HERE.parents[1] / "targets")
#: DDP's and torch.distributed's Python code: an exception raised there is DDP's verdict on the
#: user's model (a finding), not a mistake in the user's own code.
_DDP_PARTS = (f"{os.sep}torch{os.sep}distributed{os.sep}", f"{os.sep}torch{os.sep}nn{os.sep}parallel{os.sep}")
#: DDP errors raised from C++ (autograd hooks, the reducer, the transports), which leave no
#: Python frame of DDP's own in the traceback.
DDP_SIGNATURES = ("Expected to have finished reduction", "Expected to mark a variable ready",
                  "DistributedDataParallel", "find_unused_parameters", "ProcessGroup",
                  "process group", "Connection closed", "Connection reset", "Gloo", "gloo",
                  "NCCL", "timed out", "Timed out", "Application timeout",
                  "c10d/reducer.cpp")  # the reducer's internal asserts (static_graph + no_sync, pytorch#143580)


def one_line(exc: BaseException) -> str:
    """``Type: first line of the message``."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


@functools.lru_cache(maxsize=1)
def _installed_dirs() -> tuple[str, ...]:
    """Where installed code lives (torch, numpy, the standard library): never the user's,
    even when the target's folder contains the virtual environment."""
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix}
    try:
        dirs.update(site.getsitepackages())
    except AttributeError:  # virtualenvs of old
        pass
    return tuple(os.path.realpath(d) for d in dirs if d)


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def is_user_file(filename: str, user_files: frozenset[str], user_dir: str | None) -> bool:
    """True when ``filename`` is the user's code (see the module docstring)."""
    path = os.path.realpath(filename)
    if path in user_files:
        return True
    if user_dir is None or not _under(path, user_dir):
        return False
    if "site-packages" in path or "dist-packages" in path:
        return False
    if any(_under(path, d) for d in _installed_dirs()):
        return False
    return _under(path, _BUILTIN_TARGETS) or not any(_under(path, d) for d in _SUITE_DIRS)


def _is_ddp_or_suite(filename: str) -> bool:
    path = os.path.realpath(filename)
    if any(part in path for part in _DDP_PARTS):
        return True
    return any(_under(path, d) for d in _SUITE_DIRS) and not _under(path, _BUILTIN_TARGETS)


def _is_ddp_error(exc: BaseException) -> bool:
    if type(exc).__module__.startswith("torch.distributed"):
        return True
    text = str(exc)
    return any(sig in text for sig in DDP_SIGNATURES)


def raised_by_ddp(exc: BaseException) -> bool:
    """True when ``exc`` is DDP's or torch.distributed's own error: raised in their code (the
    innermost frame) or carrying one of the C++ errors' signatures. A finding, never blamed on
    what the target returned."""
    frames = traceback.extract_tb(exc.__traceback__)
    if frames and any(part in os.path.realpath(frames[-1].filename) for part in _DDP_PARTS):
        return True
    return _is_ddp_error(exc)


def shown_path(filename: str) -> str:
    """A path as the user would type it: relative to the working directory when below it."""
    path = Path(filename)
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def blame(exc: BaseException, *, user_files: frozenset[str], user_dir: str | None) -> str | None:
    """``file:line`` of the user's line that raised ``exc``, or None when it is not theirs."""
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [i for i, f in enumerate(frames) if is_user_file(f.filename, user_files, user_dir)]
    if not mine:
        return None
    innermost = mine[-1]
    if any(_is_ddp_or_suite(f.filename) for f in frames[innermost + 1:]):
        return None
    if _is_ddp_error(exc):
        return None
    frame = frames[innermost]
    return f"{shown_path(frame.filename)}:{frame.lineno}"


def defined_at(fn: Callable[..., Any]) -> str:
    """``file:line`` where a function is defined (for a value it *returned* wrongly)."""
    code = getattr(inspect.unwrap(fn), "__code__", None)
    if code is None:
        return "?"
    return f"{shown_path(code.co_filename)}:{code.co_firstlineno}"


def source_files(functions: Iterable[Any]) -> frozenset[str]:
    """The files the target's functions are defined in (a target may import them)."""
    files = set()
    for fn in functions:
        code = getattr(inspect.unwrap(fn), "__code__", None) if callable(fn) else None
        if code is not None:
            files.add(os.path.realpath(code.co_filename))
    return frozenset(files)


# -- signatures -----------------------------------------------------------------------------

_MODEL_NAMES = ("model", "module", "net", "network")


@functools.lru_cache(maxsize=256)
def _signature(fn: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(fn)
    except (TypeError, ValueError):  # builtins without a signature: let the call decide
        return None


def takes_model(fn: Callable[..., Any]) -> bool:
    """``build_optimizer(model)`` rather than ``build_optimizer(params)``: its first parameter is
    named model/module/net/network or annotated as a Module."""
    sig = _signature(fn)
    if sig is None or not sig.parameters:
        return False
    first = next(iter(sig.parameters.values()))
    if first.name in _MODEL_NAMES:
        return True
    annotation = first.annotation
    text = annotation if isinstance(annotation, str) else getattr(annotation, "__name__", "")
    return "Module" in str(text)


def takes_keyword(fn: Callable[..., Any], name: str) -> bool:
    """True when ``fn`` has a parameter called ``name`` that can be passed by keyword."""
    sig = _signature(fn)
    if sig is None:
        return False
    param = sig.parameters.get(name)
    return param is not None and param.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                                inspect.Parameter.KEYWORD_ONLY)


def positional_count(fn: Callable[..., Any], *, besides: tuple[str, ...] = ()) -> int:
    """How many positional arguments ``fn`` can take (parameters named in ``besides`` aside);
    a large number for ``*args`` or an unreadable signature."""
    sig = _signature(fn)
    if sig is None:
        return 99
    count = 0
    for param in sig.parameters.values():
        if param.kind == inspect.Parameter.VAR_POSITIONAL:
            return 99
        if param.name in besides:
            continue
        if param.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            count += 1
    return count


def binds(fn: Callable[..., Any], n: int, *, keywords: tuple[str, ...] = ()) -> bool:
    """True when ``fn`` accepts ``n`` positional arguments plus ``keywords`` (or its signature is
    unreadable)."""
    sig = _signature(fn)
    if sig is None:
        return True
    try:
        sig.bind(*range(n), **{k: None for k in keywords})
    except TypeError:
        return False
    return True


def signature_text(fn: Callable[..., Any]) -> str:
    sig = _signature(fn)
    return f"{getattr(fn, '__name__', 'function')}{sig if sig is not None else '(...)'}"
