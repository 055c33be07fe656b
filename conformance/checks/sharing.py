"""The shared-weights check's discovery and its single-process reference (``shared_weights``).

- :func:`discover` — tied aliases (``named_parameters(remove_duplicate=False)``), modules
  called more than once per forward, the shared parameters and an unshared control;
- :func:`reference_probe` — in the 1-rank reference world: which uses of a tied weight
  contribute a gradient (``_per_use``) and the single-process gradient of every global batch,
  written to the check's folder with the initial weights (:func:`start_from_reference` puts
  them into rank 0's model before DDP's construction broadcast). Never on rank 0 alone inside
  the N-rank world: a forward may call a collective (SyncBatchNorm, a gather layer, an
  all-reduced statistic), and on one rank of N it would wait for the others forever.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ..harness.batches import first_dim, part_dims, rows
from ..harness.ddp import MODEL_SEED
from ..harness.parallel import full
from ..harness.rank_run import RankRun
from ..harness.sharding import batch_dims, global_batch, shard, to_device
from ..harness.world import RankContext
from .equivalence import disable_dropout, first_mixing, group_batchnorm, read_snapshot, row_prints, write_snapshot

#: DDP iterations per variant, and the reference's global batches.
ITERATIONS = 2
#: The reference's initial weights in its folder: rank 0 starts from them (``start_from_reference``).
INITIAL = "initial"
#: The reference's per-sample fingerprints of its first forward (``equivalence.mixing``), in its
#: folder: each rank holds its own first forward's to them (``mixing_of``).
MIXING = "mixing.pt"

#: The control's size cap (elements): its reference gradient is written and read back per step
#: like the shared ones', and a million elements show a common factor as well as a billion.
CONTROL_MAX_ELEMENTS = 1 << 20


def _alias_groups(model: Any) -> list[list[str]]:
    by_id: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        by_id.setdefault(id(p), []).append(name)
    return [names for names in by_id.values() if len(names) > 1]


def _count_calls(model: Any, batch: tuple[Any, Any], compute_loss: Any) -> dict[str, int]:
    """Forward calls per module with parameters of its own, in one forward driven the target's
    way (``compute_loss``: its ``forward_loss``, or ``loss_fn(model(inputs), targets)``), so a
    model whose forward takes two inputs, a hidden state or its targets is called as training
    calls it. On the discovery model, dropped right after: no BatchNorm statistic or other side
    effect reaches a model that is compared."""
    import torch

    calls: dict[str, int] = {}
    handles = []
    for name, module in model.named_modules():
        if any(True for _ in module.parameters(recurse=False)):
            def hook(m: Any, a: Any, o: Any, _name: str = name) -> None:
                calls[_name] = calls.get(_name, 0) + 1
            handles.append(module.register_forward_hook(hook))
    try:
        with torch.no_grad():
            compute_loss(model, batch[0], batch[1])
    finally:
        for h in handles:
            h.remove()
    return calls


def _per_use(model: Any, groups: list[list[str]], batch: tuple[Any, Any],
             compute_loss: Any) -> list[dict[str, Any]]:
    """Untie every alias into its own Parameter and see which uses contribute a gradient.

    A use is *lost* when its copy changes the output (perturbing it moves the loss: forward
    does read it) yet receives no gradient — exactly what ``weight.detach()`` or ``.data`` in
    one use does. An alias forward never reads is bookkeeping, not a lost use.
    """
    import torch
    from torch import nn

    untied = copy.deepcopy(model)
    for names in groups:
        for name in names[1:]:
            owner, _, attr = name.rpartition(".")
            module = untied.get_submodule(owner)
            setattr(module, attr, nn.Parameter(getattr(module, attr).detach().clone()))
    untied.zero_grad(set_to_none=True)
    loss = compute_loss(untied, batch[0], batch[1])
    loss.backward()
    report = []
    for names in groups:
        uses: dict[str, float] = {}
        lost: list[str] = []
        unread: list[str] = []
        for name in names:
            param = untied.get_parameter(name)
            norm = 0.0 if param.grad is None else float(param.grad.detach().double().norm())
            uses[name] = norm
            if norm > 0.0:
                continue
            with torch.no_grad():
                saved = param.detach().clone()
                param.add_(0.1 * saved.abs().mean().clamp_min(1e-3) * torch.ones_like(param))
                moved = float(compute_loss(untied, batch[0], batch[1])) != float(loss)
                param.copy_(saved)
            (lost if moved else unread).append(name)
        report.append({"names": names, "gradient_norm_per_use": uses, "lost_uses": lost,
                       "unread_aliases": unread})
    return report


def discover(target: Any, model: Any, batch: tuple[Any, Any], device: Any) -> dict[str, Any]:
    """Tied aliases, modules called more than once per forward, the shared parameters and the
    control, on the discovery model (never trained)."""
    groups = _alias_groups(model)
    # Counted on the discovery model itself: it is dropped right after (never trained), so a
    # BatchNorm statistic its no_grad forward moves reaches nothing.
    calls = _count_calls(model, to_device([batch], device)[0], target.compute_loss)
    shared = sorted({name for g in groups for name in g[:1]}
                    | {f"{m}.{p}" if m else p for m, c in calls.items() if c > 1
                       for p, _ in model.get_submodule(m).named_parameters(recurse=False)})
    return {"groups": groups, "reused": {m: c for m, c in calls.items() if c > 1}, "shared": shared,
            "control": _control(model, shared)}


def reference_probe(rank_ctx: RankContext, target_spec: str, batch_size: int, world_size: int,
                    folder: str) -> dict[str, Any]:
    """The 1-rank reference world: which uses contribute, and the single-process gradient of
    every global batch, written to ``folder`` with the initial weights (``INITIAL``) the ranks
    start from. Here, not on rank 0 inside the N-rank world: a forward may call a collective
    (SyncBatchNorm, a gather layer, an all-reduced statistic), and on one rank of N it would
    wait for the others forever; in a world of one it completes, as on one GPU."""
    run = RankRun.load(rank_ctx, target_spec)
    target, device = run.target, rank_ctx.device
    batches = [global_batch(target, batch_size, seed=MODEL_SEED + step) for step in range(ITERATIONS)]
    model = run.build(seed=MODEL_SEED)
    found = discover(target, model, shard(batches[0], 0, world_size, 1, dims=batch_dims(target))[0], device)
    if not found["shared"]:
        return found
    write_snapshot(Path(folder), INITIAL, model.state_dict().items())
    # As the ranks do (``probe``): dropout off, BatchNorm in each rank's shard's groups.
    disable_dropout(model)
    group_batchnorm(model, batch_size // world_size)
    found.update(_reference(model, found["groups"], found["shared"], found["control"], batches, target,
                            device, Path(folder)))
    return found


def _reference(model: Any, groups: list[list[str]], shared: list[str], control: list[str], batches: list[Any],
               target: Any, device: Any, snapshots: Path) -> dict[str, Any]:
    """The reference world: which uses contribute, and the single-process reference gradient of
    every global batch (plain autograd on a copy of the initial weights), written to ``snapshots``."""
    from .equivalence import first_nonfinite

    try:
        per_use = _per_use(model, groups, to_device([batches[0]], device)[0], target.compute_loss)
    except Exception as exc:  # noqa: BLE001 - the probe's own surgery, never the user's verdict
        # Untying an alias is the suite's surgery on a copy, not how the target trains: a model
        # that cannot be driven untied (its forward_loss reads the tie itself, a module that
        # cannot be deep-copied) skips this part with the reason; the DDP comparison still runs.
        per_use = [{"names": g, "per_use_skipped": f"{type(exc).__name__}: {str(exc)[:200]}"}
                   for g in groups]
    import torch

    ref_model = copy.deepcopy(model)
    nonfinite = []
    for step, batch in enumerate(batches):
        ref_model.zero_grad(set_to_none=True)
        x, y = to_device([batch], device)[0]
        # The first forward fingerprints its samples as it runs (no forward of its own): a
        # mismatch on the ranks is then told from a model that mixes samples (``mixing_of``).
        with sample_prints(ref_model, target, x, on=step == 0) as calls:
            target.compute_loss(ref_model, x, y).backward()
        if step == 0:
            torch.save(calls, snapshots / MIXING)
        live = [(s, live_grad(ref_model, s)) for s in shared + control]
        nonfinite.append(first_nonfinite(live[:len(shared)]))
        write_snapshot(snapshots, f"ref{step}", live)
    del ref_model
    return {"per_use": per_use, "reference_nonfinite": nonfinite}


def _control(model: Any, shared: list[str]) -> list[str]:
    """One parameter that is not shared, compared beside the shared ones: when it is off by the
    same factor, the cause is the loss or the data, not the sharing (a summed loss halves every
    gradient at 2 ranks, the tied one too). The largest that trains within
    CONTROL_MAX_ELEMENTS (a big one's gradient is well above rounding), else the smallest.
    Empty when every parameter is shared."""
    candidates = sorted((p.numel(), name) for name, p in model.named_parameters()
                        if p.requires_grad and name not in shared)
    if not candidates:
        return []
    within = [c for c in candidates if c[0] <= CONTROL_MAX_ELEMENTS]
    return [(within[-1] if within else candidates[0])[1]]


def start_from_reference(model: Any, snapshots: Path, device: Any) -> None:
    """Rank 0, before wrapping (DDP's construction broadcast then carries these weights to every
    rank): the reference's initial weights, so a build that is not deterministic given the seed
    still starts both sides alike."""
    import torch

    state = model.state_dict()
    with torch.no_grad():
        for name, ref in read_snapshot(snapshots, INITIAL, device):
            mine = state.get(name)
            if mine is not None and ref is not None and tuple(mine.shape) == tuple(ref.shape):
                mine.copy_(ref)


def live_grad(model: Any, name: str) -> Any:
    grad = model.get_parameter(name).grad
    # FSDP2: the full gradient (an all-gather: every rank reads the same names in order).
    return None if grad is None else full(grad.detach())


@contextlib.contextmanager
def sample_prints(model: Any, target: Any, inputs: Any, *, on: bool = True) -> Iterator[list[Any]]:
    """``equivalence.row_prints`` of ``model``'s calls inside the block, per sample of ``inputs``
    along the target's ``batch_dim``; nothing watched (an empty list) unless ``on``."""
    if not on:
        yield []
        return
    dims = part_dims(batch_dims(target), 0)
    with row_prints(model, rows=rows(inputs, dims), dim=first_dim(dims)) as calls:
        yield calls


def mixing_of(calls: list[Any], snapshots: Path, start: int) -> dict[str, Any] | None:
    """Rank side: this rank's first forward (``sample_prints``) against the reference's rows of
    the same samples, from row ``start`` (``equivalence.first_mixing``): where the model mixes
    samples, or None (also when the reference's fingerprints cannot be read here)."""
    import torch

    path = snapshots / MIXING
    if not calls or not path.exists():
        return None
    found = first_mixing(torch.load(path, weights_only=True), [(start, calls)])
    return found.to_json() if found is not None else None
