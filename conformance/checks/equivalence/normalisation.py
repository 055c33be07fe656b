"""BatchNorm in the equivalence checks: the same normalisation groups on both sides.

Plain BatchNorm normalises over the batch its forward receives. Under DDP that is each rank's
microbatch (B/(N·K) samples) — or each rank's whole shard (B/N) when ``train_step`` joins its
microbatches into one batch — while the single-process reference sees all B samples at once.
Comparing those compares two different models, whatever DDP does.

So on both sides every BatchNorm normalises over consecutive groups of G = B/(N·K) samples
(its own forward, applied group by group). The N-rank run's groups are exactly its
microbatches; the reference's groups, in order, are the same samples (rank-major, contiguous
shards). The check then judges DDP alone, whether ``train_step`` joins microbatches or not,
and a loss that sums instead of averaging is seen as on any other model. Batches whose size is
not a multiple of G are normalised whole; the sizes statistics were taken over are recorded
(``sizes_seen``), and when the N-rank run normalised over one smaller size (a ``train_step``
that splits its microbatches further), the reference uses that size as its group.
"""

from __future__ import annotations

from typing import Any

_GROUPED: dict[type, type] = {}
GROUP_ATTR = "_conformance_group"
SEEN_ATTR = "_conformance_sizes_seen"


def _grouped_class(cls: type) -> type:
    if cls not in _GROUPED:
        import torch

        def forward(self: Any, x: Any) -> Any:
            size, group = int(x.shape[0]), getattr(self, GROUP_ATTR)
            if size > group and size % group == 0:
                getattr(self, SEEN_ATTR).add(group)
                return torch.cat([cls.forward(self, chunk) for chunk in x.split(group)])  # type: ignore[attr-defined]
            # Normalised whole: at or below the group size (a step that splits its microbatches
            # further), or not a multiple of it. The size is what the statistics were taken over.
            getattr(self, SEEN_ATTR).add(size)
            return cls.forward(self, x)  # type: ignore[attr-defined]

        _GROUPED[cls] = type(f"Grouped{cls.__name__}", (cls,), {"forward": forward})
    return _GROUPED[cls]


def group_batchnorm(model: Any, group: int) -> list[str]:
    """Make every plain (training-mode) BatchNorm of ``model`` normalise per ``group`` samples.

    The class of each module is swapped for a subclass (not a bound-method patch), so copies
    of the model keep working. Returns the names of the modules changed.
    """
    from torch import nn

    names = []
    for name, module in model.named_modules():
        if (isinstance(module, nn.modules.batchnorm._BatchNorm)
                and not isinstance(module, nn.SyncBatchNorm) and module.training):
            module.__class__ = _grouped_class(type(module))
            setattr(module, GROUP_ATTR, group)
            setattr(module, SEEN_ATTR, set())
            names.append(name)
    return names


def sizes_seen(model: Any) -> list[int]:
    """Every number of samples a grouped BatchNorm took its statistics over (sorted)."""
    return sorted({s for m in model.modules() for s in getattr(m, SEEN_ATTR, ())})
