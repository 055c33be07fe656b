"""batch_layout: which rows of each BatchNorm call are which samples, observed on the model —
one forward per view, views concatenated (view-major), a pair packed per sample (sample-major),
token ids — and a BatchNorm after an op that mixes samples is unmapped with the reason. The
grouped BatchNorm then normalises the whole batch exactly as N·K separate microbatches would
(production), whatever the layout. Unit tests: no world."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from conformance.checks.equivalence.batch_layout import Layout, layout_record, observe_layouts, unmapped
from conformance.checks.equivalence.normalisation import group_batchnorm, sizes_seen


class Tower(nn.Module):
    def __init__(self, layout: str) -> None:
        super().__init__()
        self.layout = layout
        self.conv = nn.Conv2d(1, 4, 3, padding=1, bias=False)
        self.bn2d = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 6, bias=False)
        self.bn1d = nn.BatchNorm1d(6)

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        h = self.bn2d(self.conv(x)).relu().mean((2, 3))
        return self.bn1d(self.fc(h))

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if self.layout == "per_view":
            za, zb = self.embed(a), self.embed(b)
        elif self.layout == "concatenated":
            za, zb = self.embed(torch.cat([a, b])).chunk(2)
        else:  # packed per sample
            z = self.embed(torch.stack([a, b], 1).flatten(0, 1)).unflatten(0, (-1, 2))
            za, zb = z[:, 0], z[:, 1]
        return (za * zb).sum(1)


def _loss(model: nn.Module, inputs, targets):  # type: ignore[no-untyped-def]
    return ((model(*inputs) - targets) ** 2).mean()


def _batch(size: int) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return (torch.randn(size, 1, 5, 5, generator=g), torch.randn(size, 1, 5, 5, generator=g)), torch.randn(size, generator=g)


@pytest.mark.parametrize(("layout", "expected"), [("per_view", Layout(1, True)), ("concatenated", Layout(2, False)),
                                                  ("packed", Layout(2, True))])
def test_the_rows_of_each_call_are_mapped_onto_samples(layout, expected):
    model = Tower(layout)
    found = observe_layouts(model, _loss, _batch(8), None).norms
    assert found == {"bn2d": expected, "bn1d": expected}
    assert all(m.training for m in model.modules())  # the probe leaves BatchNorm in training mode
    assert float(model.bn2d.num_batches_tracked) == 0  # and its running statistics untouched


@pytest.mark.parametrize("layout", ["per_view", "concatenated", "packed"])
def test_grouped_whole_batch_normalises_as_its_microbatches_do(layout):
    # The reference's grouped BatchNorm on the whole batch of 8 is production's per-microbatch
    # BatchNorm on 4 microbatches of 2 samples (both views of each microbatch together). Batch-
    # first grouping by rows (the rule before) differs wherever a sample has two rows.
    torch.manual_seed(0)
    model = Tower(layout)
    (a, b), y = _batch(8)
    production = torch.cat([copy.deepcopy(model)(a[i:i + 2], b[i:i + 2]) for i in range(0, 8, 2)])
    reference = copy.deepcopy(model)
    group_batchnorm(reference, 2, layouts=observe_layouts(reference, _loss, ((a, b), y), None).norms)
    torch.testing.assert_close(reference(a, b), production, rtol=1e-5, atol=1e-6)
    assert sizes_seen(reference) == [2]  # samples, not rows
    if layout != "per_view":
        by_rows = copy.deepcopy(model)
        group_batchnorm(by_rows, 2)
        assert not torch.allclose(by_rows(a, b), production, rtol=1e-3, atol=1e-4)


def test_token_ids_are_changed_within_their_range():
    model = nn.Sequential(nn.Embedding(5, 6), nn.Flatten(), nn.Linear(18, 4), nn.BatchNorm1d(4))
    ids = torch.tensor([[0, 1, 2], [3, 4, 0], [1, 1, 1], [4, 4, 4]])
    found = observe_layouts(model, lambda m, x, y: m(x).sum(), (ids, torch.zeros(4)), None).norms
    assert found == {"3": Layout(1, True)}


def test_rows_that_mix_samples_are_unmapped_with_the_reason():
    class Mirrored(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc, self.norm = nn.Linear(3, 4), nn.BatchNorm1d(4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.fc(x)
            return self.norm(h + h.flip(0))

    model = Mirrored()
    found = observe_layouts(model, lambda m, x, y: m(x).sum(), (torch.randn(6, 3), torch.zeros(6)), None).norms
    assert isinstance(found["norm"], str) and "mixes samples" in found["norm"]
    record = {"batchnorm_layouts": {"norm": layout_record(found["norm"])}}
    assert unmapped([record]) == {"norm": found["norm"]}
    # Not observed (one sample, nothing to tell apart): batch-first, said, and no reason to doubt.
    assert observe_layouts(model, lambda m, x, y: m(x).sum(), (torch.randn(1, 3), torch.zeros(1)), None).norms == {}
    assert unmapped([{"batchnorm_layouts": {"norm": layout_record(None)}}]) == {}


def test_a_layout_refuses_zero_rows_per_sample():
    with pytest.raises(ValueError, match="per_sample=0 must be >= 1"):
        Layout(0)


def test_a_sequence_major_router_with_a_zero_gate_is_mapped_through_a_jittered_copy():
    # Megatron's [s, b, h] tokens flattened: every sample's first token, then every second. The
    # gate starts at zeros, so its scores depend on no input: seen on a copy with jittered weights.
    class Router(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.gate = nn.Parameter(torch.zeros(3, 4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (B, T, 3)
            scores = x.transpose(0, 1).reshape(-1, 3) @ self.gate
            return scores.topk(2, dim=-1)[0].sum()

    model = Router()
    seen = observe_layouts(model, lambda m, x, y: m(x), (torch.randn(6, 5, 3), torch.zeros(6)), None)
    assert seen.routing == [Layout(5, False)] and seen.norms == {}
    assert not model.gate.detach().any()  # the model itself is left as it was
    assert seen.records([])["routing_layouts"] == [{"rows_per_sample": 5, "arrangement": "view-major"}]


def test_routing_rows_are_put_sample_by_sample_before_the_ranks_are_joined():
    import numpy as np

    from conformance.checks.equivalence.routing import first_flip

    def call(rows: np.ndarray) -> tuple[int, int, bytes]:
        return (len(rows), 1, rows.astype(np.int64).reshape(-1, 1).tobytes())

    # 2 samples per rank, 3 tokens each, sequence-major: row t*S + s holds token t of sample s.
    # Sample s's token t chooses expert 10*s + t (global s), on every side alike.
    def seq_major(samples: list[int]) -> np.ndarray:
        return np.array([10 * s + t for t in range(3) for s in samples])

    layout = [{"rows_per_sample": 3, "arrangement": "view-major"}]
    reference = {"routing": [[call(seq_major([0, 1, 2, 3]))]], "routing_layouts": layout}
    ranks = [{"routing": [[call(seq_major([0, 1]))]], "routing_layouts": layout},
             {"routing": [[call(seq_major([2, 3]))]], "routing_layouts": layout}]
    assert first_flip(reference, ranks) == (None, "1 step(s) of top-k decisions compared, all identical")
    # Laid out batch-first (the layouts unknown), the same decisions read as a flip.
    blind = [{k: v for k, v in r.items() if k != "routing_layouts"} for r in [reference, *ranks]]
    flip, _ = first_flip(blind[0], blind[1:])
    assert flip is not None and flip.tokens > 0
