"""Built-in target ``tied-lm``: a tiny character-level language model whose input embedding
is tied to its output projection, trained on seeded Faker text.

    ddp-conformance run --target tied-lm
    ddp-conformance run --target conformance/targets/tied_lm.py --checks shared-weights
    torchrun --standalone --nproc-per-node 2 -m conformance run --attach --target tied-lm

The tied weight (``embed.weight`` is ``lm_head.weight``) receives two gradient contributions
per backward; DDP must mark it ready only after the last one (shared-weights check). The loss
is a mean over a fixed number of tokens per sample (no padding), so the N-rank step equals the
single-process step. ``epoch_batches`` is a textbook DistributedSampler + DataLoader pipeline.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch
from torch import nn

# A fixed alphabet, not one learned from the text: the vocabulary must not depend on the
# installed Faker version, or two machines would build different models.
ALPHABET = " abcdefghijklmnopqrstuvwxyz.,'-"
UNKNOWN = len(ALPHABET)
VOCAB = len(ALPHABET) + 1
SEQ = 24  # tokens per sample; every sample has exactly SEQ targets (no padding)
DIM = 32
DATASET_SIZE = 50  # sentences in the epoch_batches dataset (not divisible by 3 or 4: padding)
LOADER_BATCH = 4

ddp_kwargs = {"find_unused_parameters": False}

_fake: Any = None


def _faker(seed: int) -> Any:
    """One Faker instance per process, re-seeded per use (construction costs ~0.3 s)."""
    global _fake
    if _fake is None:
        from faker import Faker

        _fake = Faker("en_US")
    _fake.seed_instance(seed)
    return _fake


def encode(text: str) -> list[int]:
    return [ALPHABET.index(c) if c in ALPHABET else UNKNOWN for c in text.lower()]


def _sample(fake: Any) -> list[int]:
    """SEQ + 1 tokens of running text (sentences joined, then cut)."""
    text = ""
    while len(text) < SEQ + 1:
        text += fake.sentence(nb_words=8) + " "
    return encode(text[:SEQ + 1])


class TiedLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.rnn = nn.GRU(DIM, DIM, batch_first=True)
        self.norm = nn.LayerNorm(DIM)
        self.lm_head = nn.Linear(DIM, VOCAB, bias=False)
        self.lm_head.weight = self.embed.weight  # the tie: one Parameter, two module paths

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.rnn(self.embed(tokens))
        return self.lm_head(self.norm(hidden))


def build_model() -> nn.Module:
    return TiedLM()


def make_batch(generator: torch.Generator, batch_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    # Faker is seeded from the suite's generator, so the batch is a pure function of it.
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
    fake = _faker(seed)
    ids = torch.tensor([_sample(fake) for _ in range(batch_size)], dtype=torch.long)
    return ids[:, :-1], ids[:, 1:]


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def _dataset() -> torch.Tensor:
    """DATASET_SIZE distinct samples (distinct rows: sampler-coverage identifies by content)."""
    fake = _faker(2024)
    rows: dict[tuple[int, ...], None] = {}
    while len(rows) < DATASET_SIZE:
        rows[tuple(_sample(fake))] = None
    return torch.tensor(list(rows), dtype=torch.long)


def epoch_batches(rank: int, world_size: int, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """What this rank's loader yields in ``epoch``: DistributedSampler (same seed on every
    rank, set_epoch every epoch) feeding a DataLoader."""
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    data = _dataset()
    dataset = TensorDataset(data[:, :-1], data[:, 1:])
    sampler: DistributedSampler[tuple[torch.Tensor, ...]] = DistributedSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=0)
    sampler.set_epoch(epoch)  # without it every epoch repeats epoch 0's order
    yield from DataLoader(dataset, batch_size=LOADER_BATCH, sampler=sampler)
