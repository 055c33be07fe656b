"""The rank-side observation kit (``conformance.harness.observe``) in-process, no world: the
driver's order and union, the one patch of torch.distributed shared by its taps, the loader,
forwards and optimizer-step probes, each put back exactly."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from conformance.harness.observe import (
    OUTSIDE,
    TRAINING,
    AllReduceBytes,
    CallCounts,
    Counts,
    Forwards,
    LoaderIndices,
    Observation,
    OptimizerSteps,
    Probe,
    Slice,
    Step,
)


class Events(Probe):
    """A probe that writes down what the driver asked of it."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log = name, log

    def attach(self, stack: contextlib.ExitStack) -> None:
        self.log.append(f"attach {self.name}")
        stack.callback(self.log.append, f"detach {self.name}")

    def begin_step(self, step: Step) -> None:
        self.log.append(f"begin {self.name} {step.index} {step.batch}")

    def end_step(self, step: Step) -> Slice:
        return {f"{self.name}_step": step.index}

    def result(self) -> Slice:
        return {self.name: len(self.log)}


def test_the_driver_attaches_in_order_journals_each_step_and_returns_the_union() -> None:
    log: list[str] = []
    journaled: list[tuple[int, dict[str, Any]]] = []
    observation = Observation([Events("a", log), Events("b", log)],
                              journal=lambda step, fields: journaled.append((step.index, fields)))
    observation.run_steps((Step(i, f"batch{i}") for i in range(2)), lambda step: log.append(f"body {step.index}"))
    assert log == ["attach a", "attach b", "begin a 0 batch0", "begin b 0 batch0", "body 0",
                   "begin a 1 batch1", "begin b 1 batch1", "body 1", "detach b", "detach a"]
    assert journaled == [(0, {"a_step": 0, "b_step": 0}), (1, {"a_step": 1, "b_step": 1})]
    assert observation.result() == {"a": 10, "b": 10}


def test_a_body_that_raises_still_detaches_every_probe_and_keeps_the_slices() -> None:
    log: list[str] = []
    observation = Observation([Events("a", log), Events("b", log)])

    def body() -> None:
        raise RuntimeError("the user's code")

    with pytest.raises(RuntimeError, match="the user's code"):
        observation.run(body)
    assert log == ["attach a", "attach b", "detach b", "detach a"]
    assert observation.result() == {"a": 4, "b": 4}


def test_taps_share_one_patch_of_torch_distributed_and_put_it_back_exactly(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []

    def fake(tensor: Any, *args: Any, **kwargs: Any) -> str:
        calls.append(tensor.numel())
        return "work"

    monkeypatch.setattr(dist, "all_reduce", fake)
    counts, sent = Counts(), []
    with CallCounts(counts).attached():
        patched = dist.all_reduce
        with AllReduceBytes(sent).attached():
            assert dist.all_reduce is patched  # one dispatcher per name, however many taps
            assert dist.all_reduce(torch.zeros(3, dtype=torch.float16)) == "work"
            assert dist.all_reduce(tensor=torch.zeros(2)) == "work"
        assert dist.all_reduce(torch.zeros(5)) == "work"  # the bytes tap is gone, the count stays
        assert sent == [6, 8]
    assert dist.all_reduce is fake
    assert calls == [3, 2, 5] and counts == {"all_reduce": 3}


def test_a_tapped_call_frees_its_arguments_without_waiting_for_the_garbage_collector(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A comm hook all-reduces DDP's bucket through the tapped function; a reference cycle around
    # the call kept a replaced bucket (a model copy) resident until a full collection.
    import gc
    import weakref

    monkeypatch.setattr(dist, "all_reduce", lambda tensor, *args, **kwargs: "work")
    counts: Counts = Counts()
    with CallCounts(counts).attached():
        bucket = torch.zeros(4)
        alive = weakref.ref(bucket)
        gc.disable()
        try:
            assert dist.all_reduce(bucket) == "work"
            del bucket
            assert alive() is None
        finally:
            gc.enable()
    assert counts == {"all_reduce": 1}


def test_the_loader_probe_counts_fetched_indices_by_root_dataset_and_yields_the_last_batch() -> None:
    from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    original = _BaseDataLoaderIter.__dict__["_next_index"]
    root = TensorDataset(torch.arange(10.0))
    subset = Subset(root, [9, 8, 7, 6, 5])
    sampler = DistributedSampler(subset, num_replicas=2, rank=0, shuffle=False)  # pads 5 to 6
    probe = LoaderIndices(fetched=True)
    with probe.attached():
        yielded = [probe.take() for _ in DataLoader(subset, batch_size=2, sampler=sampler)]
    samples = probe.result()["samples"]
    assert samples.indices == {"TensorDataset[10]": (9, 7, 5)}  # subset positions 0, 2, 4
    assert [(s.dataset_len, s.num_replicas, s.total_size) for s in samples.samplers] == [(5, 2, 6)]
    assert yielded == [["Subset[0]", "Subset[2]"], ["Subset[4]"]]
    assert _BaseDataLoaderIter.__dict__["_next_index"] is original


def test_the_forwards_probe_tells_ddp_from_inner_and_training_from_not() -> None:
    class Wrapper(nn.Module):  # DDP's shape: the model as .module
        def __init__(self, module: nn.Module) -> None:
            super().__init__()
            self.module = module

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.module(x)

    inner = nn.Linear(2, 1)
    wrapper = Wrapper(inner)
    per_step = Forwards(wrapper=wrapper, inner=inner)
    kinds, started = Counts(), []
    loop = Forwards(kinds=kinds, on_training=lambda: started.append(1))
    with per_step.attached(), loop.attached():
        loop.watch(wrapper)
        wrapper(torch.zeros(1, 2))
        inner(torch.zeros(1, 2))  # DDP bypassed
        with torch.no_grad():
            wrapper(torch.zeros(1, 2))
        per_step.end_step(Step(0))
    wrapper(torch.zeros(1, 2))  # detached: not counted
    assert per_step.result() == {"ddp_forwards": [2], "inner_forwards": [3], "unsynchronised_forwards": [None]}
    assert kinds == {TRAINING: 2, OUTSIDE: 1} and started == [1, 1]


def test_the_optimizer_step_probe_sees_every_optimizer_while_attached() -> None:
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen: list[Any] = []
    probe = OptimizerSteps(post=lambda opt, args, kwargs: seen.append(opt))
    with probe.attached():
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()
        torch.optim.Adam(model.parameters()).step()
    optimizer.step()  # detached: not seen
    assert probe.steps == 2 and seen[0] is optimizer and isinstance(seen[1], torch.optim.Adam)


def test_a_tapped_call_leaves_no_reference_to_its_arguments_once_it_returned(monkeypatch: pytest.MonkeyPatch) -> None:
    # A DDP bucket all-reduced through a tap must be freed when the call returns, not at the
    # next full garbage collection (a whole model's bucket stayed resident into the next step).
    import gc
    import weakref

    monkeypatch.setattr(dist, "all_reduce", lambda tensor, *args, **kwargs: "work")
    bucket = torch.zeros(4)
    alive = weakref.ref(bucket)
    gc.disable()
    try:
        with CallCounts(Counts()).attached(), AllReduceBytes([]).attached():
            assert dist.all_reduce(bucket, async_op=True) == "work"
            del bucket
            assert alive() is None
    finally:
        gc.enable()
