"""Resume's own probes of a run_loop life (``harness.observe.Probe``): each attaches itself for
the loop's duration and returns its own slice of each step's journal record (``end_step``);
the steps are signalled by the optimizer-step probe (``life.Steps``) and journaled by the
driver (``harness.observe.Observation``). The batches' dataset indices come from the shared
loader-index probe (``harness.observe.LoaderIndices``).

How a checkpoint is seen without touching the user's code — both ways, for different needs:

- *completed* checkpoints, from the filesystem: after every optimizer step the listing of
  ``ctx.checkpoint_dir`` (names and sizes) is journaled. A save after step s is complete, with
  whatever rename the loop does, by the time step s + 1 returns; so the first step whose
  listing is non-empty is a kill point "after a completed checkpoint and one more step",
  whatever wrote the files (torch.save, safetensors, torch.distributed.checkpoint).
- a save *in progress*, from ``torch.save`` wrapped on the rank: the start and end of each
  save and its path are journaled, and the kill during a save happens inside the wrapper, at
  a point keyed by (steps done, rank) — deterministic, never a timer racing the write. A kill
  needs the exact instant a write is under way, which a listing cannot give.

The kills use no collective (a dead peer would hang it): ranks meet through marker files.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import io
import os
import re
import shutil
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ...harness.batches import sample_rows
from ...harness.observe import LoaderIndices, Probe, Slice, Step, unseen
from ...harness.patching import replaced as _replaced
from ...harness.parallel import comparable
from ...harness.world import proc_state

from .records import KillPlan, LoadRecord, SaveRecord, in_place_copy, to_line

#: Parameters larger than this (bytes, per snapshot) are journaled by digest only: a difference
#: is then judged bit for bit, with no tolerance (docs/numerics.md). Only the lives that are
#: compared keep values (the uninterrupted run and the restarts): at most 7 snapshots each.
VALUES_CAP = 16 << 20
#: How long a rank waits at a kill point for its peers (marker files) before going alone.
KILL_BARRIER_S = 30.0


class Journal:
    """This rank's append-only journal (JSON lines) and its parameter values file."""

    def __init__(self, path: Path, values: Path) -> None:
        self._lines = open(path, "a", buffering=1)  # line-buffered: each event reaches the kernel whole
        self._values = open(values, "ab")
        self.layout_written = False

    def write(self, kind: str, record: Any) -> None:
        self._lines.write(to_line(kind, record))

    def values(self, tensors: list[Any]) -> int:
        offset = self._values.tell()
        for t in tensors:
            # FSDP2: a sharded parameter's full value (``parallel.comparable``: every rank alike).
            t = comparable(t.detach()).cpu().contiguous()
            self._values.write(t.reshape(-1).view(_uint8()).numpy().tobytes())
        self._values.flush()
        return offset

    def close(self) -> None:
        self._lines.close()
        self._values.close()


def _sharded(obj: Any, depth: int = 0) -> int:
    """How many FSDP2 shards (DTensors with a Shard placement) ``obj`` holds, in its dicts,
    lists and tuples: a state dict of a sharded model saved as is holds only this rank's part."""
    placements = getattr(obj, "placements", None)
    if placements is not None:
        return int(any(p.is_shard() for p in placements))
    if depth > 8:
        return 0
    items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
    return sum(_sharded(v, depth + 1) for v in items)


def plain(text: str) -> str:
    """``text`` without terminal escapes (torch's weights_only message sets bold in it)."""
    return re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)


#: What a checkpoint may hold and weights_only loads (besides containers): tensors and plain values.
_PLAIN = (str, bytes, int, float, complex, bool, type(None))


def _not_plain_in(load: Callable[..., Any], f: Any, folder: Path | None, most: int = 3) -> list[str]:
    """Where a checkpoint that weights_only refused holds objects other than tensors, plain
    values and containers: up to ``most`` paths with their types (``['optimizer']
    ['param_groups'][0]['lr']: numpy.float64``), read by loading it again with
    weights_only=False: only a file in ``folder`` (ctx.checkpoint_dir, which this very loop
    wrote in this run; never a file from elsewhere, such as downloaded weights). Empty when
    that fails."""
    import torch

    if not isinstance(f, (str, os.PathLike)) or folder is None:
        return []  # a file object or buffer: already read, not read again
    if not Path(f).resolve().is_relative_to(Path(folder).resolve()):
        return []
    try:
        obj = load(f, map_location="cpu", weights_only=False)
    except Exception:  # noqa: BLE001 - a class the loop pickled may not import here: no paths then
        return []
    found: list[str] = []
    stack: collections.deque[tuple[str, Any]] = collections.deque([("", obj)])  # breadth first: shallow paths first
    while stack and len(found) < most:
        path, value = stack.popleft()
        # Exact types: a numpy.float64 is a float subclass, and weights_only refuses it.
        if isinstance(value, torch.Tensor) or type(value) in (torch.Size, torch.dtype, torch.device, *_PLAIN):
            continue
        if type(value) in (dict, collections.OrderedDict):
            stack.extend((f"{path}[{k!r}]", v) for k, v in value.items())
        elif type(value) in (list, tuple, set):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(value))
        else:
            kind = type(value)
            found.append(f"checkpoint{path}: {kind.__module__}.{kind.__qualname__}")
    return found


def _uint8() -> Any:
    import torch

    return torch.uint8


def _clean(name: str) -> str:
    for prefix in ("_orig_mod.", "module."):
        while name.startswith(prefix):
            name = name[len(prefix):]
    return name


def _half_written(original: Callable[..., Any], obj: Any, f: Any, *args: Any, **kwargs: Any) -> bytes:
    """The first half of the bytes ``torch.save`` (``original``) would write for ``obj`` written
    to ``f`` (a path, opened for writing, or the loop's own file object) and synced: what a kill
    half-way through the save leaves there. Returns the second half."""
    buffer = io.BytesIO()
    original(obj, buffer, *args, **kwargs)
    data = buffer.getvalue()
    half = len(data) // 2
    if isinstance(f, (str, os.PathLike)):
        with open(f, "wb") as out:
            out.write(data[:half])
            out.flush()
            os.fsync(out.fileno())
    else:
        f.write(data[:half])
        f.flush()
        with contextlib.suppress(OSError, AttributeError, io.UnsupportedOperation):
            os.fsync(f.fileno())
    return data[half:]


def _stopped(pid: int, within_s: float = 2.0) -> bool:
    """``pid`` is in the stopped state (a SIGSTOP is delivered asynchronously: a process on
    another core may run on for a moment after ``kill`` returns)."""
    until = time.monotonic() + within_s
    while time.monotonic() < until:
        if proc_state(pid) in ("", "T", "t", "Z"):
            return True  # stopped; or gone, and it writes nothing either
        time.sleep(0.0005)
    return False


def rng_digest() -> str:
    """A digest of torch's global random state (CUDA's too, once initialised)."""
    import torch

    h = hashlib.sha1(torch.get_rng_state().numpy().tobytes())
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        h.update(torch.cuda.get_rng_state().numpy().tobytes())
    return h.hexdigest()[:16]


def die(peers: Sequence[int] = ()) -> None:
    """SIGKILL the peers' process groups (the ranks lead their own), then this process."""
    for pid in peers:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


class Samples(Probe):
    """The input rows each step trained on (a digest per row of the first tensor a training
    forward got), torch's RNG state at the step's first training forward, and whether a
    dropout was active there. Eval forwards (no grad or eval mode) are not counted. ``dim``:
    the batch dimension of that tensor (the target's ``batch_dim``, ``batches.first_dim``)."""

    def __init__(self, *, dim: int = 0, batches: LoaderIndices | None = None) -> None:
        self.dim = dim
        self.batches = batches
        self.rows: list[str] = []
        self.indices: list[str] = []
        self.rng: str | None = None
        self.dropout = False
        self._handles: list[Any] = []

    def watch(self, model: Any) -> None:
        self._handles.append(model.register_forward_pre_hook(unseen(self._forward), with_kwargs=True))

    def _forward(self, module: Any, args: Any, kwargs: Any) -> None:
        import torch

        if not (torch.is_grad_enabled() and module.training):
            return
        if self.batches is not None:
            self.indices.extend(self.batches.take())
        if self.rng is None:
            self.rng = rng_digest()
            self.dropout = any(isinstance(m, torch.nn.modules.dropout._DropoutNd) and m.p > 0 and m.training
                               for m in module.modules())
        first = _first_tensor((args, kwargs))
        if first is None or first.dim() == 0:
            return
        rows = sample_rows(first, self.dim if -first.dim() <= self.dim < first.dim() else 0)
        as_bytes = rows.view(_uint8()).numpy() if rows.numel() else None
        for i in range(rows.shape[0]):
            self.rows.append(hashlib.sha1(b"" if as_bytes is None else as_bytes[i].tobytes()).hexdigest()[:12])

    def attach(self, stack: contextlib.ExitStack) -> None:
        stack.callback(self._remove)

    def _remove(self) -> None:
        for handle in self._handles:
            handle.remove()

    def end_step(self, step: Step) -> Slice:
        out = {"samples": self.rows, "rng": self.rng, "dropout": self.dropout, "indices": self.indices}
        self.rows, self.rng, self.dropout, self.indices = [], None, False, []
        return out


def _first_tensor(obj: Any) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj
    items = obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else ()
    for item in items:
        found = _first_tensor(item)
        if found is not None:
            return found
    return None


class Listing(Probe):
    """The checkpoint folder's listing (relative names and sizes) after each step."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    def attach(self, stack: contextlib.ExitStack) -> None:
        pass  # read from the filesystem at each step's end: nothing to hook

    def end_step(self, step: Step) -> Slice:
        entries = []
        for root, _, files in os.walk(self.folder):
            for name in files:
                path = Path(root) / name
                with contextlib.suppress(OSError):
                    entries.append(f"{path.relative_to(self.folder)}:{path.stat().st_size}")
        entries.sort()
        return {"listing": hashlib.sha1("\n".join(entries).encode()).hexdigest()[:16], "files": len(entries)}


class Saves(Probe):
    """``torch.save`` wrapped: each save's start and end journaled; the planned kill during a
    save done here (half the bytes written and synced, then the world torn down), or its copy
    (``copy``: the plan and where to copy the folder; ``_torn_copy``)."""

    def __init__(self, journal: Journal, folder: Path, plan: KillPlan, rank: int, steps: Callable[[], int],
                 markers: Callable[[str], Path], world_size: int,
                 copy: tuple[KillPlan, Path] | None = None) -> None:
        self.journal, self.folder, self.plan, self.rank = journal, Path(folder), plan, rank
        self.steps, self.markers, self.world_size = steps, markers, world_size
        self.copy = copy
        self.fired = False
        self.saved: list[tuple[int, str]] = []  # (step, path) of this rank's saves into the folder so far
        self.copied: set[Path] = set()

    def _where(self, f: Any) -> tuple[str, bool, Any]:
        name = f if isinstance(f, (str, os.PathLike)) else getattr(f, "name", None)
        if not isinstance(name, (str, os.PathLike)):
            return "<in-memory buffer>", False, None
        path = Path(name).resolve()
        try:
            return str(path.relative_to(self.folder.resolve())), True, path
        except ValueError:
            return str(path), False, path

    def _save(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
            step = self.steps()
            where, inside, _ = self._where(f)
            self.journal.write("save", SaveRecord(step, where, inside, ended=False, sharded=_sharded(obj)))
            plan = self.plan
            if (plan.kind == "during-save" and inside and not self.fired and plan.rank == self.rank
                    and plan.step == step and (not plan.path or where == plan.path)):
                self.fired = True
                self._torn(original, obj, f, *args, **kwargs)
            to = self._copies_here(inside, step, where)
            if to is not None and self._torn_copy(to, step, original, obj, f, *args, **kwargs):
                out = None  # written whole by the copy (a file object: its second half)
            else:
                out = original(obj, f, *args, **kwargs)
            if inside:
                self.saved.append((step, where))
            self.journal.write("save", SaveRecord(step, where, inside, ended=True))
            if inside and plan.kind == "during-save":
                # The n-th save of this round, for a victim waiting for all of a peer's saves.
                done = sum(1 for s, _ in self.saved if s == step)
                self.markers(f"saved-{step}-rank{self.rank}-{done}").touch()
            return out

        return save

    def _torn(self, original: Callable[..., Any], obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        """Half of this save's bytes on disk, then every rank of the world killed.

        The peers that write at this point too finish every save they make there first (their
        markers, one per save): the torn write is the last one, so what is on disk after the
        kill does not depend on who ran faster. (Measured: waiting for a peer's first save only,
        a peer that saves a new file and then the very file torn here rewrote it whole after
        the tear in one run of three under load, and the torn checkpoint went unseen.)
        """
        plan = self.plan
        counts = plan.peer_saves if len(plan.peer_saves) == len(plan.peers) else (1,) * len(plan.peers)
        until = time.monotonic() + KILL_BARRIER_S
        while (time.monotonic() < until
               and not all(self.markers(f"saved-{plan.step}-rank{p}-{n}").exists() for p, n in zip(plan.peers, counts))):
            time.sleep(0.005)
        _half_written(original, obj, f, *args, **kwargs)
        self.journal.write("end", {"how": "killed", "raised": None})
        die(self._peer_pids())

    def _copies_here(self, inside: bool, step: int, where: str) -> Path | None:
        """Where to copy the folder half-way through this save, if anywhere: the copy point's
        round (``copy``'s plan), its first save, and its first save over a file an earlier round
        wrote (``in_place_copy``: a torn overwrite loses the previous checkpoint, which the
        round's other saves may leave whole; ``scenarios.during_save_plan`` tears that one)."""
        if self.copy is None or not inside or self.copy[0].rank != self.rank or self.copy[0].step != step:
            return None
        to = self.copy[1]
        if any(s == step for s, _ in self.saved):  # not the round's first save
            if where not in {p for s, p in self.saved if s < step}:
                return None
            to = in_place_copy(to)
        if to in self.copied:
            return None
        self.copied.add(to)
        return to

    def _torn_copy(self, to: Path, step: int, original: Callable[..., Any], obj: Any, f: Any,
                   *args: Any, **kwargs: Any) -> bool:
        """The kill during this save, copied instead of carried out (the killed-during-save
        scenario's first life taken from the uninterrupted one, as ``life.Steps._copy_here``
        does between steps): half of this save's bytes written, every peer stopped (SIGSTOP,
        its process group: where a SIGKILL would have caught it, nothing more written), the
        checkpoint folder copied — what the kill leaves on disk: a kill loses nothing the
        kernel already has, and nothing is written after it — then the peers continued and
        the save completed. True when the save was completed here (a file object: its second
        half written after the first); a path is written whole again by the caller.

        The copy point is a plan with no peers saving there (``scenarios.during_save_guess``);
        no copy (nothing journaled) when a peer did not stop: the check then kills a first life
        for real."""
        rest = _half_written(original, obj, f, *args, **kwargs)
        stopped: list[int] = []
        copied = False
        try:
            for pid in self._peer_pids():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGSTOP)
                    stopped.append(pid)
            if all(_stopped(pid) for pid in stopped):
                shutil.copytree(self.folder, to, symlinks=True)
                copied = True
        except OSError:  # shutil.Error too: no copy, and the check kills a first life instead
            pass
        finally:
            for pid in stopped:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGCONT)
        if copied:
            self.journal.write("copied-in-save", {"step": step, "in_place": to == in_place_copy(self.copy[1])
                                                  if self.copy else False})
        if isinstance(f, (str, os.PathLike)):
            return False
        f.write(rest)
        return True

    def _peer_pids(self) -> list[int]:
        pids = []
        for r in range(self.world_size):
            path = self.markers(f"pid-rank{r}")
            if r != self.rank and path.exists():
                with contextlib.suppress(ValueError, OSError):
                    pids.append(int(path.read_text()))
        return pids

    def attach(self, stack: contextlib.ExitStack) -> None:
        import torch

        stack.enter_context(_replaced(torch, "save", self._save))


class Loads(Probe):
    """The restore calls of the loop journaled: ``load_state_dict`` on modules, optimizers,
    schedulers and scalers (strict, missing and unexpected keys), ``torch.load`` and its error."""

    def __init__(self, journal: Journal, folder: Path | None = None) -> None:
        self.journal = journal
        self.folder = folder  # ctx.checkpoint_dir: only a file there is read again (``_not_plain_in``)

    def _module(self, original: Callable[..., Any]) -> Callable[..., Any]:
        journal = self.journal

        def load_state_dict(module: Any, state_dict: Any, strict: bool = True, *args: Any, **kwargs: Any) -> Any:
            keys = len(module.state_dict())
            try:
                out = original(module, state_dict, strict, *args, **kwargs)
            except Exception as exc:
                journal.write("load", LoadRecord("module", type(module).__name__, strict, keys,
                                                 error=f"{type(exc).__name__}: {str(exc)[:300]}"))
                raise
            missing, unexpected = list(out.missing_keys), list(out.unexpected_keys)
            journal.write("load", LoadRecord("module", type(module).__name__, strict, keys, missing[:5],
                                             len(missing), unexpected[:5], len(unexpected)))
            return out

        return load_state_dict

    def _other(self, what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        journal = self.journal

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            def load_state_dict(owner: Any, *args: Any, **kwargs: Any) -> Any:
                journal.write("load", LoadRecord(what, type(owner).__name__))
                return original(owner, *args, **kwargs)

            return load_state_dict

        return make

    def _load(self, original: Callable[..., Any]) -> Callable[..., Any]:
        journal = self.journal

        def load(f: Any, *args: Any, **kwargs: Any) -> Any:
            where = str(f) if isinstance(f, (str, os.PathLike)) else str(getattr(f, "name", "<buffer>"))
            try:
                return original(f, *args, **kwargs)
            except Exception as exc:
                # weights_only's refusal names the global it refused far into a long message.
                refused = re.search(r"Unsupported global: GLOBAL ([\w.]+)", str(exc))
                named = f" [refused global: {refused.group(1)}]" if refused else ""
                journal.write("load", LoadRecord("torch.load", where,
                                                 error=f"{type(exc).__name__}: {plain(str(exc))[:300]}{named}",
                                                 refused_at=_not_plain_in(original, f, self.folder) if refused
                                                 else []))
                raise

        return load

    def attach(self, stack: contextlib.ExitStack) -> None:
        import torch
        from torch.amp.grad_scaler import GradScaler
        from torch.optim.lr_scheduler import LRScheduler

        stack.enter_context(_replaced(torch.nn.Module, "load_state_dict", self._module))
        stack.enter_context(_replaced(torch.optim.Optimizer, "load_state_dict", self._other("optimizer")))
        stack.enter_context(_replaced(LRScheduler, "load_state_dict", self._other("scheduler")))
        stack.enter_context(_replaced(GradScaler, "load_state_dict", self._other("scaler")))
        stack.enter_context(_replaced(torch, "load", self._load))
