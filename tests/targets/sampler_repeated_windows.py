"""Correct target whose dataset repeats its own content: a char-level corpus ("abcabc…") cut
into windows, so the same window occurs many times. The pipeline is a correct
DistributedSampler; samples are told apart by index, so sampler-coverage must pass — content
identity would call the repeated windows duplicates. A second pipeline (``epoch_windows``,
a generator) yields the windows themselves: content identity, corrected for what every epoch
repeats, must pass as well.

    ddp-conformance run --target tests/targets/sampler_repeated_windows.py --checks sampler-coverage
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from conformance.targets.mlp import build_model, loss_fn, make_batch  # noqa: F401

# "abcabc…" then distinct characters: windows inside the repeated run are equal (i and i+3).
TEXT = torch.tensor([0, 1, 2] * 8 + list(range(3, 40)))
WINDOW = 4


class Windows(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    def __len__(self) -> int:
        return len(TEXT) - WINDOW

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return TEXT[i:i + WINDOW].float(), TEXT[i + 1:i + 1 + WINDOW].float()


def epoch_batches(rank: int, world_size: int, epoch: int):  # type: ignore[no-untyped-def]
    sampler = DistributedSampler(Windows(), num_replicas=world_size, rank=rank, seed=0, drop_last=True)
    sampler.set_epoch(epoch)
    return DataLoader(Windows(), batch_size=4, sampler=sampler)


def epoch_windows(rank: int, world_size: int, epoch: int):  # type: ignore[no-untyped-def]
    """The same pipeline as a generator of tensors: identity by content."""
    for inputs, targets in epoch_batches(rank, world_size, epoch):
        yield inputs, targets
