"""The typed records of resume equivalence: what a rank journals, and the kill plan it obeys.

A rank cannot return anything through the world's pipe once it has been SIGKILLed, so every
observation is appended to a per-rank journal file (JSON lines, one object per event) as it
happens; the supervisor reads the journals back after the world is gone. A line cut short by
a kill is dropped (``read_journal``): only whole events count.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: Scenario names (journal file names, evidence keys).
UNINTERRUPTED, KILLED_BETWEEN, KILLED_DURING_SAVE = "uninterrupted", "killed-between-steps", "killed-during-save"


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The training state at one point of a step: per parameter a digest (bit identity), the
    optimizer state per key, every param group's lr, each GradScaler's (scale, growth tracker)."""

    params: dict[str, str]
    optimizer: dict[str, tuple[int, str, float]]  # key -> (tensors, digest, sum |x|)
    lrs: list[float]
    scalers: list[tuple[float, int]]
    norm: float = 0.0  # the parameters' L2 norm: the report's trajectory
    values: int | None = None  # offset of the parameters' bytes in the life's values file; None: not kept

    @staticmethod
    def of(raw: dict[str, Any]) -> Snapshot:
        return Snapshot(params=dict(raw["params"]),
                        optimizer={k: (int(v[0]), str(v[1]), float(v[2])) for k, v in raw["optimizer"].items()},
                        lrs=[float(x) for x in raw["lrs"]],
                        scalers=[(float(s), int(t)) for s, t in raw["scalers"]], norm=float(raw.get("norm", 0.0)),
                        values=raw.get("values"))


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One optimizer step of one life of one rank (index: 1-based within the life)."""

    index: int
    before: Snapshot  # at optimizer.step()'s entry: what the step starts from (restored state)
    after: Snapshot  # where optimizer.step() returns
    samples: list[str]  # digests of the input rows the step's training forwards saw
    rng: str | None  # torch's RNG state at the step's first training forward
    dropout: bool  # a dropout module with p > 0 was in training mode at that forward
    listing: str  # digest of the checkpoint folder's listing (names, sizes) after the step
    files: int  # files in the checkpoint folder after the step
    #: torch's RNG state moved between the step's first training forward and optimizer.step():
    #: the step drew random numbers (dropout, stochastic depth, random masking, noise)
    drew: bool = False
    #: the dataset indices of the batches torch DataLoaders yielded since the previous step
    #: (``harness.observe.LoaderIndices``; empty when the loop draws its batches otherwise)
    indices: list[str] = field(default_factory=list)

    @staticmethod
    def of(raw: dict[str, Any]) -> StepRecord:
        return StepRecord(index=int(raw["index"]), before=Snapshot.of(raw["before"]),
                          after=Snapshot.of(raw["after"]), samples=list(raw["samples"]),
                          rng=raw.get("rng"), dropout=bool(raw.get("dropout")),
                          listing=str(raw["listing"]), files=int(raw["files"]), drew=bool(raw.get("drew")),
                          indices=list(raw.get("indices", [])))


@dataclass(frozen=True, slots=True)
class SaveRecord:
    """A ``torch.save`` the loop made: after how many optimizer steps of its life, where to."""

    step: int
    path: str  # relative to the checkpoint folder when inside it, else as given
    inside: bool  # written inside ctx.checkpoint_dir
    ended: bool  # False: the start of the save (a save that never ends was killed)
    #: FSDP2 shards (DTensors not replicated) in what was saved: each is this rank's part only.
    sharded: int = 0


@dataclass(frozen=True, slots=True)
class LoadRecord:
    """A restore call the loop made on restart (``Module/Optimizer/LRScheduler/GradScaler
    .load_state_dict``, ``torch.load``): what it was called on and what came of it."""

    what: str  # "module" | "optimizer" | "scheduler" | "scaler" | "torch.load"
    owner: str  # the class name (or the path, for torch.load)
    strict: bool | None = None
    keys: int = 0  # keys the module expected
    missing: list[str] = field(default_factory=list)  # up to 5 names
    missing_count: int = 0
    unexpected: list[str] = field(default_factory=list)
    unexpected_count: int = 0
    error: str | None = None  # the exception it raised (torch.load of a torn file)
    #: a checkpoint weights_only refused: where it holds objects other than tensors and plain
    #: values, with their types (up to 3)
    refused_at: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Life:
    """One process lifetime of one rank: its steps, saves and loads, and how it ended."""

    rank: int
    steps: list[StepRecord]
    saves: list[SaveRecord]
    loads: list[LoadRecord]
    ended: str  # "completed" | "killed" | "raised" | "" (no end written: killed by a peer)
    raised: str | None = None  # the loop's exception (one line, with its file:line when the user's)
    #: (name, dtype, shape) of each parameter in a values record, in order
    layout: list[tuple[str, str, tuple[int, ...]]] = field(default_factory=list)
    #: the step after which this life's checkpoint folder was copied (``live``'s ``copy_to``; 0: never)
    copied: int = 0
    #: the step whose save this rank was half-way through when the folder was copied (``live``'s
    #: ``copy_in_save``; 0: never)
    copied_in_save: int = 0
    #: the step whose save over a file of an earlier round (in place) this rank was half-way
    #: through when the folder was copied (``in_place_copy``; 0: never)
    copied_in_place: int = 0

    @property
    def checkpoint_files(self) -> int:
        return self.steps[-1].files if self.steps else 0


@dataclass(frozen=True, slots=True)
class KillPlan:
    """Where the life is to be killed, keyed by steps and saves, never by time.

    ``after-step``: every rank, once its optimizer step ``step`` has returned, meets the others
    at a file barrier and SIGKILLs itself (the whole world dies between steps). ``during-save``:
    rank ``rank``, in its first ``torch.save`` after ``step`` optimizer steps (into ``path``
    when set), waits until the ``peers`` that save at that point have finished every save they
    make there (``peer_saves``: how many, per peer, as the uninterrupted run made), writes half
    the bytes, then SIGKILLs the other ranks (torchrun tears the group down on a worker's
    death) and itself.
    """

    kind: str  # "none" | "after-step" | "during-save"
    step: int = 0
    rank: int = 0
    peers: tuple[int, ...] = ()
    #: during-save: the save to tear, by its path in the folder ("": the rank's first save after
    #: ``step``); set when a later save of the round overwrites a file of an earlier round
    path: str = ""
    #: per peer, its saves into the folder after ``step`` steps (the victim waits for the last)
    peer_saves: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ("none", "after-step", "during-save"):
            raise ValueError(f"KillPlan kind={self.kind!r} is not none, after-step or during-save")


def in_place_copy(copy: Path) -> Path:
    """Where the checkpoint folder is copied half-way through the round's first save over a
    file of an earlier round, beside ``copy`` (half-way through the round's first save)."""
    return Path(f"{copy}-in-place")


def journal_path(folder: Path, scenario: str, life: int, rank: int) -> Path:
    return Path(folder) / f"{scenario}-life{life}-rank{rank}.jsonl"


def values_path(folder: Path, scenario: str, life: int, rank: int) -> Path:
    return Path(folder) / f"{scenario}-life{life}-rank{rank}.values"


def marker(folder: Path, scenario: str, life: int, name: str) -> Path:
    """A file whose existence one rank tells the others something through (the kill's barrier,
    a peer's save having ended, a rank's pid): no collective may be used at a kill point."""
    return Path(folder) / f"{scenario}-life{life}.{name}"


def to_line(kind: str, record: Any) -> str:
    return json.dumps({"kind": kind, **(asdict(record) if not isinstance(record, dict) else record)}) + "\n"


def read_journal(path: Path, rank: int) -> Life:
    """A rank's journal as a Life; a last line cut short by a kill is ignored."""
    steps: list[StepRecord] = []
    saves: list[SaveRecord] = []
    loads: list[LoadRecord] = []
    ended, raised = "", None
    layout: list[tuple[str, str, tuple[int, ...]]] = []
    copied = copied_in_save = copied_in_place = 0
    text = path.read_text() if path.exists() else ""
    for line in text.splitlines():
        try:
            raw = json.loads(line)
        except json.JSONDecodeError:
            continue  # the line a kill interrupted
        kind = raw.pop("kind")
        if kind == "step":
            steps.append(StepRecord.of(raw))
        elif kind == "save":
            saves.append(SaveRecord(**raw))
        elif kind == "load":
            loads.append(LoadRecord(**raw))
        elif kind == "layout":
            layout = [(str(n), str(d), tuple(int(x) for x in shape)) for n, d, shape in raw["params"]]
        elif kind == "end":
            ended, raised = raw["how"], raw.get("raised")
        elif kind == "copied":
            copied = int(raw["step"])
        elif kind == "copied-in-save" and raw.get("in_place"):
            copied_in_place = int(raw["step"])
        elif kind == "copied-in-save":
            copied_in_save = int(raw["step"])
    return Life(rank, steps, saves, loads, ended, raised, layout, copied, copied_in_save, copied_in_place)


def stopped_at(life: Life, step: int) -> Life:
    """``life`` as a whole-world kill after its step ``step`` would have left its journal: the
    steps up to it and the saves begun before it (a save journaled with ``step`` s runs between
    steps s and s + 1), ended by the kill."""
    return Life(life.rank, life.steps[:step], [s for s in life.saves if s.step < step], list(life.loads),
                "killed", None, life.layout)


def stopped_in_save(life: Life, plan: KillPlan) -> Life:
    """``life`` as the kill during a save (``plan``) would have left its journal: the steps up
    to ``plan.step`` (no peer can return from another step while the victim saves: the step's
    all-reduce needs it), the saves begun before, the peers' saves at that point (they finish
    first) and, on the victim, its saves up to the torn one, begun and never ended."""
    saves = []
    for save in life.saves:
        if save.step < plan.step or (save.step == plan.step and life.rank in plan.peers):
            saves.append(save)
        elif save.step == plan.step and life.rank == plan.rank:
            saves.append(save)
            if save.inside and not save.ended and (not plan.path or save.path == plan.path):
                break  # the torn save (journal order is the rank's own): the kill came half-way through it
    return Life(life.rank, life.steps[:plan.step], saves, list(life.loads), "killed", None, life.layout)
