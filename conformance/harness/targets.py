"""Load and validate a target: the user's model, data, loss, optimizer and training code.

    load_target("mlp")                    # a built-in, by name
    load_target("path/to/my_target.py")   # a file (its folder importable, as for a script)
    load_target("mypkg.ddp_target")       # an importable module

The names a target defines are the public contract written down in the README section
'Writing a target'. Everything a user can get wrong is caught here, at the edge, as a
TargetError whose one-line message says what is wrong and how to fix it; the CLI turns it into
exit code 2. Checks never call the user's functions directly: they call
``target.compute_loss``, ``target.make_optimizer`` and ``target.run_step``, which pass the
arguments each function's signature asks for and turn an exception raised by the user's own
code into a TargetError naming the function and ``file:line`` (``call_target``).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import os
import sys
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable, Iterable

from ._layout import batch_error, declaration_error
from .batches import call_model, is_batch_part
from .returned import LAYOUTS, optimizer_problem
from .target_calls import (
    binds,
    blame,
    defined_at,
    is_user_file,
    one_line,
    positional_count,
    raised_by_ddp,
    shown_path,
    signature_text,
    source_files,
    takes_keyword,
    takes_model,
)

BUILTINS = ("mlp", "tied-lm", "branchy", "convbn", "trainer")
#: Every target error cites the README section that documents the names, by its real title
#: (tests/test_architecture.py holds every citation in the code to the headings of README.md).
SEE = "see the README section 'Writing a target'"
REQUIRED = ("build_model", "make_batch")  # and loss_fn, unless forward_loss is defined
OPTIONAL_CALLABLES = ("loss_fn", "forward_loss", "build_optimizer", "train_step", "epoch_batches",
                      "run_loop", "configure_ddp", "evaluate")
#: ``sampling``: how the target draws its training samples. "epochs": a sampler that visits every
#: sample once per epoch (DistributedSampler), which sampler-coverage verifies through
#: ``epoch_batches``; "with-replacement": random draws (e.g. random windows of a token stream),
#: where there is no epoch to cover.
SAMPLING_MODES = ("epochs", "with-replacement")
#: ``sample_identity``: what ``epoch_batches`` yields per batch. "content": the batch itself
#: (samples told apart by a hash of their input rows); "index": the batch's sample indices
#: (a list of ints or a 1-D integer tensor), so repeated content in the dataset is never
#: mistaken for a duplicate.
SAMPLE_IDENTITIES = ("content", "index")
# DDP constructor arguments a target may set; anything else is a typo that DDP would reject
# only later, inside a rank process, with a less helpful message.
DDP_KWARGS = ("find_unused_parameters", "bucket_cap_mb", "static_graph", "gradient_as_bucket_view",
              "broadcast_buffers", "forward_sync_buffers", "init_sync", "check_reduction",
              "process_group", "mixed_precision")
#: torch's warning for a loss whose input and target shapes differ and silently broadcast
#: (mse_loss, l1_loss…): the loss is then wrong on every rank alike, so no check would see it.
_BROADCAST_WARNING = r"Using a target size .* that is different to the input size"


class TargetError(ValueError):
    """The target cannot be used as written. The message is one line: what and how to fix."""


def default_build_optimizer(params: Any) -> Any:
    import torch

    return torch.optim.SGD(params, lr=0.1)


def accumulate_step(model: Any, optimizer: Any, microbatches: list[tuple[Any, Any]],
                    loss_of: Callable[[Any, Any, Any], Any]) -> None:
    """The textbook DDP step: no_sync on all but the last microbatch, loss divided by K;
    ``loss_of(model, inputs, targets)`` computes one microbatch's loss."""
    optimizer.zero_grad(set_to_none=True)
    k = len(microbatches)
    for i, (inputs, targets) in enumerate(microbatches):
        # Only the last backward of the window may all-reduce; the others just accumulate.
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


def call_target(target: Any, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, with an exception raised by the user's own code turned into a
    one-line TargetError: target function, ``file:line``, exception.

    Exceptions that are not the user's (DDP's errors on their model, the suite's own, an
    injected fault) propagate unchanged: they are findings of the check. ``target`` is
    anything with ``name`` and, for blame, ``user_files``/``user_dir`` (a chaos vehicle has
    neither: nothing of it is the user's).
    """
    try:
        return fn(*args, **kwargs)
    except TargetError:
        raise
    except Exception as exc:
        where = blame(exc, user_files=getattr(target, "user_files", frozenset()),
                      user_dir=getattr(target, "user_dir", None))
        if where is None:
            _raise_if_batch_changed(target, what, exc)
            raise
        raise TargetError(f"target {target.name!r}: {what} raised {one_line(exc)} at {where}"
                          f"{_hint(what, exc)}; fix it in your target ({SEE})") from exc


def _raise_if_batch_changed(target: Any, what: str, exc: Exception) -> None:
    """An error that is neither the user's line nor DDP's, after make_batch changed its batch's
    layout between calls (``returned.BatchLayouts``): what the target returned is the cause
    the message names, with the error it led to, never DDP."""
    spec = getattr(target, "spec", None)
    changed = LAYOUTS.changed(spec) if isinstance(spec, str) else None
    if changed is None or raised_by_ddp(exc):
        return
    raise TargetError(f"target {target.name!r}: make_batch (defined at {defined_at(target.make_batch)}) "
                      f"returned {changed}, and {what} then raised {one_line(exc)}; return the same "
                      f"structure, dtypes and shapes on every call, only the batch dimension "
                      f"following batch_size ({SEE})") from exc


def _hint(what: str, exc: BaseException) -> str:
    if what == "build_optimizer" and isinstance(exc, AttributeError) and "'generator'" in str(exc):
        return (" — build_optimizer got model.parameters(); to get the model, name its first "
                "parameter `model`")
    return ""


def _target_error_of(results: Iterable[Any]) -> TargetError | None:
    """A TargetError raised on a rank, rebuilt on the supervisor from that rank's RankError
    (world calls return rank errors by type name and message), or None."""
    for result in results:
        error = getattr(result, "error", None)
        if error is not None and error.kind == "exception" and error.exc_type == "TargetError":
            return TargetError(error.message)
    return None


def raise_target_error(results: Iterable[Any]) -> None:
    """Re-raise on the supervisor a TargetError that a rank raised: the user's mistake ends the
    run with exit 2 and its one line, not as a failed check (worlds call this first)."""
    error = _target_error_of(results)
    if error is not None:
        raise error


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


@dataclass(frozen=True)
class Target(TargetCalls):
    """A loaded target. ``spec`` is what rank processes pass to load_target to get it back."""

    name: str
    spec: str
    module: ModuleType
    build_model: Callable[[], Any]
    make_batch: Callable[[Any, int], Any]
    loss_fn: Callable[[Any, Any], Any] | None = None
    forward_loss: Callable[[Any, Any], Any] | None = None
    build_optimizer: Callable[[Any], Any] = default_build_optimizer
    train_step: Callable[..., None] = default_train_step
    ddp_kwargs: dict[str, Any] = field(default_factory=dict)
    epoch_batches: Callable[[int, int, int], Any] | None = None
    run_loop: Callable[[Any], None] | None = None
    # Called on every DDP model right after construction (ddp.configure): comm hooks, DDP state.
    configure_ddp: Callable[[Any], Any] | None = None
    # The target's own distributed evaluation: evaluate(model, ctx) -> {metric: value} (eval-equivalence).
    evaluate: Callable[[Any, Any], Any] | None = None
    builtin: bool = False
    global_batch_size: int | None = None  # optional extension: the production global batch
    sampling: str = "epochs"  # one of SAMPLING_MODES
    sample_identity: str = "content"  # one of SAMPLE_IDENTITIES
    # Where make_batch's tensors hold the batch (harness.batches): None is dim 0 everywhere.
    batch_dim: Any = None
    # Where the user's code lives, for telling their exceptions from DDP's (target_calls.blame).
    user_files: frozenset[str] = frozenset()
    user_dir: str | None = None

    def batch_size_for(self, world_size: int, microbatches: int = 1) -> int:
        """The global batch a check uses (:func:`global_batch_for`)."""
        return global_batch_for(self.name, self.global_batch_size, world_size, microbatches)

    def info(self) -> TargetInfo:
        """What the supervisor may know of this target: names and settings, none of its code."""
        return TargetInfo(name=self.name, spec=self.spec, builtin=self.builtin,
                          defines=frozenset(a for a in OPTIONAL_CALLABLES
                                            if getattr(self, a) is not None and not _is_default(self, a)),
                          ddp_kwargs={k: _plain(v) for k, v in self.ddp_kwargs.items()},
                          global_batch_size=self.global_batch_size, sampling=self.sampling,
                          sample_identity=self.sample_identity)


def global_batch_for(name: str, global_batch_size: int | None, world_size: int,
                     microbatches: int = 1) -> int:
    """The global batch a check uses: the target's own, or 4 samples per microbatch per rank.

    Raises TargetError when the target's batch cannot be split evenly (the README section
    'Writing a target': it is split into world_size contiguous chunks, each into K
    microbatches).
    """
    unit = world_size * microbatches
    if global_batch_size is None:
        return 4 * unit
    if global_batch_size % unit:
        raise TargetError(f"target {name!r}: global_batch_size={global_batch_size} is "
                          f"not divisible by world_size={world_size} x microbatches={microbatches}; "
                          f"use a multiple of {unit} ({SEE})")
    return global_batch_size


def _is_default(target: Target, attr: str) -> bool:
    return (attr, getattr(target, attr)) in (("build_optimizer", default_build_optimizer),
                                             ("train_step", default_train_step))


def _plain(value: Any) -> Any:
    """A ddp_kwargs value as the supervisor sees it: JSON's plain values as they are, anything
    else (a MixedPrecision, a process group) as its repr."""
    return value if value is None or isinstance(value, (bool, int, float, str)) else repr(value)


@dataclass(frozen=True)
class TargetInfo:
    """A target as the supervisor knows it: its names and settings, never its code.

    The supervisor (the CLI's process, the pytest controller) never imports the user's code:
    an import can exit the process, start threads and processes, install signal handlers or
    change the working directory. A child process loads the target and sends this back as
    JSON (``conformance/harness/world/validate.py``); ranks load the target itself by ``spec``.
    """

    name: str
    spec: str
    builtin: bool = False
    #: The optional functions the target defines (OPTIONAL_CALLABLES), not the suite's defaults.
    defines: frozenset[str] = frozenset()
    ddp_kwargs: dict[str, Any] = field(default_factory=dict)
    global_batch_size: int | None = None
    sampling: str = SAMPLING_MODES[0]
    sample_identity: str = SAMPLE_IDENTITIES[0]

    def has(self, attr: str) -> bool:
        """True when the target defines the optional function ``attr`` (e.g. ``run_loop``)."""
        return attr in self.defines

    def batch_size_for(self, world_size: int, microbatches: int = 1) -> int:
        """The global batch a check uses (:func:`global_batch_for`)."""
        return global_batch_for(self.name, self.global_batch_size, world_size, microbatches)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "spec": self.spec, "builtin": self.builtin,
                "defines": sorted(self.defines), "ddp_kwargs": self.ddp_kwargs,
                "global_batch_size": self.global_batch_size, "sampling": self.sampling,
                "sample_identity": self.sample_identity}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TargetInfo:
        return cls(name=str(data["name"]), spec=str(data["spec"]), builtin=bool(data["builtin"]),
                   defines=frozenset(data["defines"]), ddp_kwargs=dict(data["ddp_kwargs"]),
                   global_batch_size=data["global_batch_size"], sampling=str(data["sampling"]),
                   sample_identity=str(data["sample_identity"]))


_CACHE: dict[str, Target] = {}


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


def load_target(spec: str) -> Target:
    """Import a target and check its names, kinds and signatures (cheap: builds nothing). Cached."""
    if spec in _CACHE:
        return _CACHE[spec]
    module, name, builtin = _import(spec)
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
    batch_dim = getattr(module, "batch_dim", None)
    wrong = declaration_error(batch_dim)
    if wrong is not None:
        raise TargetError(f"target {name!r}: {wrong} ({SEE})")
    target = Target(name=name, spec=spec, module=module, ddp_kwargs=dict(ddp_kwargs),
                    builtin=builtin, global_batch_size=batch_size, sampling=sampling,
                    sample_identity=identity, batch_dim=batch_dim, user_files=_user_files(module, found),
                    user_dir=_user_dir(module), **found)
    _CACHE[spec] = target
    return target


def _choice(module: ModuleType, name: str, attr: str, allowed: tuple[str, ...]) -> str:
    value = getattr(module, attr, allowed[0])
    if value not in allowed:
        raise TargetError(f"target {name!r}: {attr} = {value!r} is not one of "
                          f"{', '.join(repr(a) for a in allowed)} ({SEE})")
    return str(value)


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
