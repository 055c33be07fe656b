"""BatchNorm in the equivalence checks: the same normalisation groups on both sides.

Plain BatchNorm normalises over the batch its forward receives. Under DDP that is each rank's
microbatch (B/(N·K) samples) — or each rank's whole shard (B/N) when ``train_step`` joins its
microbatches into one batch — while the single-process reference sees all B samples at once.
Comparing those compares two different models, whatever DDP does.

So on both sides every BatchNorm normalises over groups of G = B/(N·K) samples (its own
forward, applied group by group). The N-rank run's groups are exactly its microbatches; the
reference's groups, in order, are the same samples (rank-major, contiguous shards). The check
then judges DDP alone, whether ``train_step`` joins microbatches or not, and a loss that sums
instead of averaging is seen as on any other model. A group is *samples*, with all their rows:
which rows of a module's input are which samples is observed on the model before training
(``batch_layout``: two views concatenated into one forward, a pair packed per sample, one
forward per view), so a call whose rows are both views of one microbatch is normalised whole,
as production does, and the reference normalises both views of each microbatch together.
Calls whose samples are not a multiple of G are normalised whole; the sample counts statistics
were taken over are recorded (``sizes_seen``), and when the N-rank run normalised over one
smaller count (a ``train_step`` that splits its microbatches further), the reference uses
that count as its group.

A BatchNorm that synchronises its statistics (``nn.SyncBatchNorm``, the suite's CPU stand-in
for it, detectron2's ``NaiveSyncBatchNorm``, any subclass whose forward calls a collective) is
not grouped: recognised by the collective its forward calls (``synchronising``). A look-alike
that skips the collective in a 1-rank world is seen by the N-rank run only: the reference then
runs again with it ungrouped (``RunPlan.ungrouped``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from ...harness.sync_batchnorm import substituted
from .batch_layout import Layout

_GROUPED: dict[type, type] = {}
GROUP_ATTR = "_conformance_group"
SEEN_ATTR = "_conformance_sizes_seen"
LAYOUT_ATTR = "_conformance_layout"
T = TypeVar("T")


def _grouped_class(cls: type) -> type:
    if cls not in _GROUPED:
        import torch

        def forward(self: Any, x: Any) -> Any:
            group, layout = getattr(self, GROUP_ATTR), getattr(self, LAYOUT_ATTR)
            size = layout.samples(int(x.shape[0]))
            if size is not None and size > group and size % group == 0:
                getattr(self, SEEN_ATTR).add(group)
                order = layout.grouped_rows(int(x.shape[0]), group)
                if order == list(range(len(order))):
                    return torch.cat([cls.forward(self, chunk)  # type: ignore[attr-defined]
                                      for chunk in x.split(group * layout.per_sample)])
                # View-major rows (views concatenated): a group's rows gathered, normalised
                # together, and put back where the model laid them.
                index = torch.tensor(order, device=x.device)
                out = torch.cat([cls.forward(self, chunk)  # type: ignore[attr-defined]
                                 for chunk in x.index_select(0, index).split(group * layout.per_sample)])
                return out.index_select(0, torch.argsort(index))
            # Normalised whole: at or below the group size (a step that splits its microbatches
            # further), or not a multiple of it. The samples are what the statistics were taken over.
            getattr(self, SEEN_ATTR).add(int(x.shape[0]) if size is None else size)
            return cls.forward(self, x)  # type: ignore[attr-defined]

        _GROUPED[cls] = type(f"Grouped{cls.__name__}", (cls,), {"forward": forward})
    return _GROUPED[cls]


def watch_synchronising(model: Any, rank: int, body: Callable[[], T]) -> tuple[T, list[str]]:
    """``body()`` (a forward of ``model``, on every rank alike) with the collectives of each
    module's forward watched: (what it returned, ``synchronising`` on what was seen)."""
    from ...harness.observe import Step, StepCollectives

    watch = StepCollectives(model, rank=rank)
    with watch.attached():
        watch.begin_step(Step(0))
        out = body()
        watch.end_step(Step(0))
    return out, synchronising(model, watch.calls)


def synchronising(model: Any, calls: Sequence[Any]) -> list[str]:
    """The BatchNorm modules of ``model`` whose own forward called a collective (``calls``:
    ``harness.observe.StepCollective``): ``nn.SyncBatchNorm``, detectron2's
    ``NaiveSyncBatchNorm``, apex's, a hand-written one — recognised by what they do, not by
    their class."""
    from torch import nn

    modules = dict(model.named_modules())
    return sorted({c.module for c in calls if c.module is not None and c.phase == "forward"
                   and isinstance(modules.get(c.module), nn.modules.batchnorm._BatchNorm)})


def group_batchnorm(model: Any, group: int, *, keep: Collection[str] = (),
                    layouts: Mapping[str, Layout | str] | None = None) -> list[str]:
    """Make every plain (training-mode) BatchNorm of ``model`` normalise per ``group`` samples;
    the synchronised ones (``keep``: ``synchronising``, and ``nn.SyncBatchNorm``) already take
    their statistics over the global batch, as the reference does, and are left alone.
    ``layouts`` (``batch_layout.observe_layouts``) says which rows of each module's input are
    which samples; a module without one (not observed, or unmapped) is taken as batch-first.

    The class of each module is swapped for a subclass (not a bound-method patch), so copies
    of the model keep working. Returns the names of the modules changed.
    """
    from torch import nn

    keep = {*keep, *substituted(model)}  # nn.SyncBatchNorm as it runs on gloo
    names = []
    for name, module in model.named_modules():
        if (isinstance(module, nn.modules.batchnorm._BatchNorm) and name not in keep
                and not isinstance(module, nn.SyncBatchNorm) and module.training):
            module.__class__ = _grouped_class(type(module))
            setattr(module, GROUP_ATTR, group)
            layout = (layouts or {}).get(name)
            setattr(module, LAYOUT_ATTR, layout if isinstance(layout, Layout) else Layout())
            setattr(module, SEEN_ATTR, set())
            names.append(name)
    return names


def sizes_seen(model: Any) -> list[int]:
    """Every number of samples a grouped BatchNorm took its statistics over (sorted)."""
    return sorted({s for m in model.modules() for s in getattr(m, SEEN_ATTR, ())})


@contextlib.contextmanager
def sizes_kept(model: Any) -> Iterator[None]:
    """A probe's forward (``start_loss``) leaves ``sizes_seen`` as the run's own forwards made it:
    the experiment picks the reference's groups from them."""
    saved = [(m, set(getattr(m, SEEN_ATTR))) for m in model.modules() if hasattr(m, SEEN_ATTR)]
    try:
        yield
    finally:
        for module, seen in saved:
            setattr(module, SEEN_ATTR, seen)
