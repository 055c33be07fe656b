"""Which samples the rows of each BatchNorm call belong to: observed on the model, not assumed.

BatchNorm normalises over the rows its forward receives, and those rows are the step's samples
in the simplest model only. A siamese network concatenates its two views into one forward
(``torch.cat([a, b])``: *view-major*, row i is sample i mod S of the call's S samples), or packs
a pair per sample and flattens it (``(B, 2, C, H, W) -> (2B, C, H, W)``: *sample-major*, row i is
sample i // m with m rows per sample), or runs one forward per view (one row per sample). The
equivalence checks normalise BatchNorm over the same groups of *samples* on both sides
(``normalisation``), so for every call they must know which rows are which samples.

Observed before training, per module: with BatchNorm in eval mode (each row normalised by the
running statistics alone, so no row depends on another through it) and no gradient, the global
batch's first few samples (``PROBE_SAMPLES``) go through the target's own loss as drawn and
then once with each sample changed, and each call's rows are fingerprinted (one random
projection per row). A row that changes with exactly one sample belongs to it; the rows per
sample and their arrangement follow. A module with a row that changes with several samples (a
BatchNorm after an op that mixes samples) or with none, or whose rows fit neither
arrangement, is *unmapped*: the record says why, and a mismatch it may explain is no finding
(``verdict``).
"""

from __future__ import annotations

import contextlib
import copy
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from ...harness.batches import part_dims, rows, take_rows, walk

#: Seed of the perturbations and fingerprints: the probe is the same on every side.
PROBE_SEED = 20261206
#: Samples the probe changes one by one: enough to tell sample-major from view-major rows,
#: few enough for the probe's forwards (one more than these) to cost next to nothing.
PROBE_SAMPLES = 4
#: The probe's key for the top-k calls (no module is named so).
TOPK = "<topk>"
SEVERAL, NONE = -1, -2  # a row's owner: several samples, none
#: A row counts as changed beyond this share of the call's largest fingerprint.
CHANGED = 1e-6
NO_SAMPLE = "some of its rows depend on no sample"


@dataclass(frozen=True, slots=True)
class Layout:
    """How a BatchNorm's rows map onto samples: ``per_sample`` rows each, sample-major (a
    sample's rows adjacent) or view-major (every sample's first row, then every second...)."""

    per_sample: int = 1
    sample_major: bool = True

    def __post_init__(self) -> None:
        if self.per_sample < 1:
            raise ValueError(f"per_sample={self.per_sample} must be >= 1")

    def samples(self, rows: int) -> int | None:
        """The samples a call of ``rows`` rows holds (None: the rows do not split into them)."""
        return None if rows % self.per_sample else rows // self.per_sample

    def grouped_rows(self, rows: int, group: int) -> list[int]:
        """The call's row indices ordered group by group (``group`` samples, all their rows,
        each): consecutive slices of ``group * per_sample`` of them are the groups."""
        count = rows // self.per_sample
        if self.sample_major:
            return list(range(rows))
        return [view * count + sample for first in range(0, count, group)
                for view in range(self.per_sample) for sample in range(first, first + group)]

    def to_json(self) -> dict[str, Any]:
        return {"rows_per_sample": self.per_sample,
                "arrangement": "sample-major" if self.sample_major else "view-major"}


def layout_record(found: Layout | str | None) -> dict[str, Any]:
    """A module's layout for the record: how its rows map onto samples, or why they do not."""
    if isinstance(found, Layout):
        return found.to_json()
    return {"unmapped": found or "not observed: taken as one row per sample, batch-first"}


def unmapped(records: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """The unmapped BatchNorms of some sides' records (``batchnorm_layouts``): name -> why."""
    return {name: str(layout["unmapped"]) for record in records
            for name, layout in (record.get("batchnorm_layouts") or {}).items()
            if "unmapped" in layout and not str(layout["unmapped"]).startswith("not observed")}


def _perturbed(inputs: Any, dims: Any, sample: int) -> Any:
    """``inputs`` with sample ``sample`` of every batched tensor changed (a copy)."""
    import torch

    start, stop = sample, sample + 1
    generator = torch.Generator().manual_seed(PROBE_SEED + sample)
    changed = copy.deepcopy(inputs)
    for _, t, dim in walk(changed, dims):
        if dim is None or not t.dim() or t.shape[dim] < stop:
            continue
        part = t.narrow(dim % t.dim(), start, stop - start)
        if t.dtype == torch.bool:
            part.logical_not_()
        elif t.is_floating_point():
            part.add_(torch.randn(part.shape, generator=generator).to(part.device, part.dtype))
        else:  # token ids: values the whole tensor holds, so every index stays in range
            low, high = t.amin(), t.amax()
            part.copy_(torch.where(part == high, low, high))
    return changed


def _row_prints(x: Any) -> Any:
    """One float64 number per row of ``x`` (rows: its first dimension), on the host."""
    import torch

    flat = x.detach().reshape(x.shape[0], -1).to(torch.float64) if x.dim() else x.detach().reshape(1, 1)
    g = torch.Generator().manual_seed(PROBE_SEED)
    return (flat @ torch.randn(flat.shape[1], generator=g, dtype=torch.float64).to(flat.device)).cpu()


@contextlib.contextmanager
def _topk_rows(found: list[Any]) -> Iterator[None]:
    """``torch.topk``/``Tensor.topk`` observed: the rows each call chooses among, in the order
    ``routing.RoutingProbe`` keeps its indices (every dimension but the last flattened)."""
    import torch

    function, method = torch.topk, torch.Tensor.topk

    def seen(*args: Any, **kwargs: Any) -> None:
        x = args[0] if args else kwargs["input"]
        dim = kwargs.get("dim", args[2] if len(args) > 2 else -1)
        if x.dim() and dim % x.dim() == x.dim() - 1:
            found.append(_row_prints(x.reshape(-1, x.shape[-1])))
        else:
            found.append(f"a top-k over dimension {dim} of {x.dim()}, not the last")

    def topk(*args: Any, **kwargs: Any) -> Any:
        seen(*args, **kwargs)
        return function(*args, **kwargs)

    def tensor_topk(self: Any, *args: Any, **kwargs: Any) -> Any:
        seen(self, *args, **kwargs)
        return method(self, *args, **kwargs)

    torch.topk = topk
    torch.Tensor.topk = tensor_topk  # type: ignore[method-assign]
    try:
        yield
    finally:
        torch.topk = function
        torch.Tensor.topk = method  # type: ignore[method-assign]


def _fingerprints(model: Any, run: Callable[[], Any]) -> dict[str, list[Any]]:
    """Per BatchNorm module (and ``TOPK``: the top-k calls), per call of one ``run()``: a
    number per row of its input."""
    from torch import nn

    found: dict[str, list[Any]] = {}
    handles = []
    for name, module in model.named_modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            def hook(_: Any, args: Any, name: str = name) -> None:
                found.setdefault(name, []).append(_row_prints(args[0]))
            handles.append(module.register_forward_pre_hook(hook))
    routing: list[Any] = []
    try:
        with _topk_rows(routing):
            run()
    finally:
        for handle in handles:
            handle.remove()
    if routing:
        found[TOPK] = routing
    return found


def _owners(base: Any, changed: list[Any]) -> Any:
    """Per row of one call: the one probe sample whose change changed it; ``SEVERAL`` for a row
    that changed with several samples (an op before it mixes them), ``NONE`` with none."""
    import torch

    # Changed by more than rounding: a changed sample moves its rows by O(1) of the call's
    # scale, while a kernel picked anew on an accelerator may move the others in the last bits.
    scale = float(base.abs().max()) if base.numel() else 0.0
    hits = torch.stack([(c - base).abs() > CHANGED * scale for c in changed])  # samples x rows
    count = hits.sum(0)
    owner = torch.where(count == 1, hits.int().argmax(0), torch.full_like(count, SEVERAL))
    return torch.where(count == 0, torch.full_like(count, NONE), owner)


def _classify(base: Any, changed: list[Any]) -> Layout | str:
    """One call's layout from its rows' fingerprints (as drawn, and with each probe sample
    changed in turn), or why it has none."""
    import torch

    if isinstance(base, str):
        return base
    if any(isinstance(c, str) or c.shape != base.shape for c in changed):
        return "its calls receive other numbers of rows when a sample changes"
    owner = _owners(base, changed)
    if bool((owner == SEVERAL).any()):
        return "some of its rows depend on several samples (an op before it mixes samples)"
    if bool((owner == NONE).any()):
        return NO_SAMPLE
    present, local = torch.unique(owner, sorted=True, return_inverse=True)
    counts = torch.bincount(local)
    if bool((counts != counts[0]).any()):
        return f"its samples have {sorted(set(counts.tolist()))} rows each"
    per, samples = int(counts[0]), len(present)
    index = torch.arange(len(owner))
    for layout, sample in ((Layout(per, True), index // per), (Layout(per, False), index % samples)):
        if bool((local == sample).all()):
            return layout
    return f"its {per} rows per sample are neither sample-major nor view-major"


class LayoutSlice(TypedDict):
    """What the probe saw, as each side's record keeps it (``records.SetupSlice``)."""

    # Per grouped BatchNorm: which rows of its input are which samples, or why that is unknown.
    batchnorm_layouts: dict[str, dict[str, Any]]
    # Per top-k call of one loss, in order: the same for its rows (``routing`` maps by it).
    routing_layouts: list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Observed:
    """What the probe saw: per BatchNorm module, and per top-k call of one loss (in order)."""

    norms: dict[str, Layout | str]
    routing: list[Layout | str]

    def records(self, grouped: list[str]) -> LayoutSlice:
        """The record's ``batchnorm_layouts`` (the grouped modules) and ``routing_layouts``."""
        return LayoutSlice(batchnorm_layouts={name: layout_record(self.norms.get(name)) for name in grouped},
                           routing_layouts=[layout_record(r) for r in self.routing])


def observe_layouts(model: Any, loss: Callable[[Any, Any, Any], Any], batch: tuple[Any, Any], dims: Any,
                    *, samples: int = PROBE_SAMPLES) -> Observed:
    """Per training-mode BatchNorm of ``model`` and per top-k call: its rows' layout, or why
    it is unmapped. ``loss(model, inputs, targets)`` is the target's loss; ``batch`` (on the
    model's device) gives its first ``samples`` samples (at least 2) to the probe. Empty where
    the probe cannot run (fewer than 2 samples, a loss that fails on changed inputs); one
    forward only where nothing is to be observed."""
    import torch

    in_dims, out_dims = part_dims(dims, 0), part_dims(dims, 1)
    count = min(samples, rows(batch[0], in_dims))
    if count < 2:
        return Observed({}, [])
    probe = (take_rows(batch[0], 0, count, in_dims), take_rows(batch[1], 0, count, out_dims))
    seen = _observe(model, loss, probe, in_dims)
    if NO_SAMPLE in seen.routing:
        # A router whose scores depend on no input yet (MoE gates initialised to zeros: every
        # token ties): its layout is structure, not values, so a copy with its weights jittered
        # shows it. Only then: the copy costs the model's memory once more.
        jittered = copy.deepcopy(model)
        g = torch.Generator().manual_seed(PROBE_SEED)
        with torch.no_grad():
            for p in jittered.parameters():
                if p.is_floating_point():
                    p.add_(0.01 * torch.randn(p.shape, generator=g).to(p.device, p.dtype))
        seen = Observed(seen.norms, _observe(jittered, loss, probe, in_dims).routing)
    return seen


def _observe(model: Any, loss: Callable[[Any, Any, Any], Any], probe: tuple[Any, Any], in_dims: Any) -> Observed:
    import torch
    from torch import nn

    inputs, targets = probe
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.training]
    try:
        for m in norms:
            m.eval()  # running statistics: every row normalised on its own, nothing updated
        with torch.no_grad():
            seen = [_fingerprints(model, functools.partial(loss, model, inputs, targets))]
            if seen[0]:
                seen += [_fingerprints(model, functools.partial(loss, model, _perturbed(inputs, in_dims, i), targets))
                         for i in range(rows(inputs, in_dims))]
    except Exception:  # noqa: BLE001 - no observation: the batch-first rule applies (recorded)
        return Observed({}, [])
    finally:
        for m in norms:
            m.train()
    out: dict[str, Layout | str] = {}
    routing: list[Layout | str] = []
    for name, calls in seen[0].items():
        others = [s.get(name, []) for s in seen[1:]]
        if any(len(o) != len(calls) for o in others):
            out[name] = "it is called a different number of times when a sample changes"
            continue
        found = [_classify(call, [o[c] for o in others]) for c, call in enumerate(calls)]
        if name == TOPK:
            routing = found
            continue
        why = [f for f in found if isinstance(f, str)]
        out[name] = (why[0] if why else found[0] if len(set(found)) == 1
                     else "its calls lay their rows out differently")
    return Observed(out, routing)
