"""SyncBatchNorm on gloo: the same maths on CPU, for the duration of a check.

``nn.SyncBatchNorm`` runs on GPUs only: its forward raises on a CPU tensor once a process
group is initialised ("SyncBatchNorm expected input tensor to be on GPU"), and DDP refuses a
CPU module that contains one ("SyncBatchNorm layers only work with GPU modules"). A model
that uses it could then not be gated on gloo CI at all. On a CPU device the suite swaps the
class of each ``nn.SyncBatchNorm`` for :class:`GlooSyncBatchNorm` (the module keeps its
parameters, buffers and settings): the batch statistics of the whole group, through a
differentiable all-reduce of each rank's per-channel sum, sum of squares and count
(``torch.distributed.nn.functional.all_reduce``: its backward all-reduces the gradient, as
SyncBatchNorm's backward does), normalisation by the biased variance, the running variance
updated with the unbiased one. In a 1-rank world the all-reduce is the identity: the same
formula as plain BatchNorm over the batch. The real module is kept on a GPU (NCCL).

The swap lasts as long as the model (every check builds its own); the record says which
modules ran substituted (``substituted``).
"""

from __future__ import annotations

from typing import Any

#: What a record says about the substitution (the report's configuration table and warnings).
SUBSTITUTED = ("nn.SyncBatchNorm cannot run on CPU: for this check on gloo it ran as the suite's "
               "CPU implementation of the same maths (global statistics through differentiable "
               "all-reduces); on NCCL the real SyncBatchNorm runs")

_CLASS: list[type] = []


def gloo_class() -> type:
    """:class:`GlooSyncBatchNorm`, built on first use (importing this module imports no torch)."""
    if _CLASS:
        return _CLASS[0]
    import torch
    import torch.distributed.nn.functional as dist_nn
    from torch import nn

    class GlooSyncBatchNorm(nn.modules.batchnorm._BatchNorm):
        """``nn.SyncBatchNorm``'s forward on CPU (module docstring)."""

        def _check_input_dim(self, input: torch.Tensor) -> None:
            if input.dim() < 2:
                raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

        def forward(self, input: torch.Tensor) -> torch.Tensor:
            self._check_input_dim(input)
            if not (self.training or self.running_mean is None):
                return super().forward(input)
            import torch.distributed as dist

            dims = [0, *range(2, input.dim())]
            count = torch.tensor([input.numel() / input.shape[1]], dtype=input.dtype, device=input.device)
            local = torch.cat([input.sum(dims), (input * input).sum(dims), count])
            group = getattr(self, "process_group", None) or dist.group.WORLD
            # Every rank of the group reaches this line in the same forward, as SyncBatchNorm's
            # own all-gather does; the all-reduce's backward sums the gradient over the ranks.
            total = dist_nn.all_reduce(local, group=group) if dist.is_initialized() else local
            c = input.shape[1]
            n = total[-1]
            mean = total[:c] / n
            var = total[c:2 * c] / n - mean * mean
            if self.training and self.track_running_stats and self.running_mean is not None:
                with torch.no_grad():
                    assert self.num_batches_tracked is not None and self.running_var is not None
                    self.num_batches_tracked.add_(1)
                    momentum = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                                else self.momentum)
                    unbiased = var * n / (n - 1).clamp(min=1)
                    self.running_mean.mul_(1 - momentum).add_(momentum * mean)
                    self.running_var.mul_(1 - momentum).add_(momentum * unbiased)
            shape = [1, c] + [1] * (input.dim() - 2)
            out = (input - mean.reshape(shape)) * torch.rsqrt(var.reshape(shape) + self.eps)
            if self.affine:
                out = out * self.weight.reshape(shape) + self.bias.reshape(shape)
            return out

    _CLASS.append(GlooSyncBatchNorm)
    return GlooSyncBatchNorm


def substitute(model: Any, device: Any) -> list[str]:
    """On a CPU ``device``, every ``nn.SyncBatchNorm`` of ``model`` runs as
    :class:`GlooSyncBatchNorm`; returns the names of the modules that now do (already
    substituted ones included), ``[]`` on a GPU."""
    from torch import nn

    if getattr(device, "type", str(device)) != "cpu":
        return []
    names = []
    for name, module in model.named_modules():
        if isinstance(module, nn.SyncBatchNorm):
            module.__class__ = gloo_class()
        if _CLASS and isinstance(module, _CLASS[0]):
            names.append(name)
    return names


def substituted(model: Any) -> list[str]:
    """The modules of ``model`` running as :class:`GlooSyncBatchNorm`."""
    return [n for n, m in model.named_modules() if _CLASS and isinstance(m, _CLASS[0])]
