"""Feature detection at run time (conformance/harness/features.py): each feature found when the
step uses it and absent when it does not.

In this process, on small models without a process group: autocast (bf16, entered inside
forward), GradScaler, reentrant and non-reentrant checkpointing, SyncBatchNorm, a module around
the DDP model, and the wrappers put back afterwards. On the shared 2-rank gloo session (a DDP
object needed): static_graph, gradient_as_bucket_view, a comm hook from configure_ddp, Join.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from conformance.harness.features import FEATURES, FeatureProbe


class Block(nn.Module):
    def __init__(self, *, autocast: bool = False, reentrant: bool | None = None) -> None:
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)
        self.autocast, self.reentrant = autocast, reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.autocast):
            h = (self.inner(x) if self.reentrant is None
                 else checkpoint(self.inner, x, use_reentrant=self.reentrant))
        return self.head(h.float())


def _features(model: nn.Module, *, scaler: torch.amp.GradScaler | None = None) -> dict[str, Any]:
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with FeatureProbe.watching(model) as probe:
        loss = model(torch.ones(2, 4, requires_grad=True)).sum()
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)  # the line the probe must name
            scaler.update()
    return probe.result()


def test_plain_fp32_eager_step_uses_no_feature():
    found = _features(Block())
    assert list(found) == list(FEATURES)
    assert not any(f["used"] for f in found.values()), found


def test_autocast_bf16_inside_forward_found_with_its_line():
    found = _features(Block(autocast=True))
    assert found["autocast"]["used"] and found["autocast"]["value"] == "bfloat16 (cpu)"
    assert found["autocast"]["where"].endswith(f"test_features.py:{Block.forward.__code__.co_firstlineno + 1}")
    # autocast(enabled=False) is not autocast.
    assert not _features(Block(autocast=False))["autocast"]["used"]


def test_grad_scaler_found_when_it_steps_and_not_when_disabled():
    found = _features(Block(), scaler=torch.amp.GradScaler("cpu", growth_interval=7))
    assert found["grad_scaler"]["used"]
    assert found["grad_scaler"]["value"] == "scale 65536, growth_interval 7"
    assert "test_features.py:" in found["grad_scaler"]["where"]
    off = _features(Block(), scaler=torch.amp.GradScaler("cpu", enabled=False))
    assert not off["grad_scaler"]["used"] and off["grad_scaler"]["value"] == "disabled"


def test_checkpointing_found_reentrant_and_not_by_module():
    reentrant = _features(Block(reentrant=True))["checkpoint"]
    assert reentrant == {"used": True, "value": "reentrant", "where": "reentrant: 'inner'"}
    plain = _features(Block(reentrant=False))["checkpoint"]
    assert plain == {"used": True, "value": "non-reentrant", "where": "non-reentrant: 'inner'"}


def test_wrappers_are_put_back_however_the_block_ends():
    import torch.utils.checkpoint as cp
    from torch.amp.grad_scaler import GradScaler

    before = (torch.autocast.__dict__["__enter__"], GradScaler.__dict__["step"],
              cp._checkpoint_without_reentrant_generator)
    try:
        with FeatureProbe.watching(Block()):
            raise RuntimeError("the step failed")
    except RuntimeError:
        pass
    assert "apply" not in cp.CheckpointFunction.__dict__
    assert (torch.autocast.__dict__["__enter__"], GradScaler.__dict__["step"],
            cp._checkpoint_without_reentrant_generator) == before


def test_sync_batchnorm_found_by_module_scan():
    model = nn.Sequential(nn.Linear(4, 4), nn.SyncBatchNorm(4), nn.Linear(4, 2))
    with FeatureProbe.watching(model) as probe:
        pass
    assert probe.result()["sync_batchnorm"] == {"used": True, "value": "1 module(s)", "where": "'1'"}
    plain = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4))
    with FeatureProbe.watching(plain) as probe:
        pass
    assert not probe.result()["sync_batchnorm"]["used"]


def _rank_side(rank_ctx: Any) -> dict[str, Any]:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.join import Join

    from conformance.harness.ddp import wrap

    def configure(m: Any) -> None:
        m.register_comm_hook(None, default_hooks.fp16_compress_hook)

    out = {}
    for label, kwargs, target in (
            ("plain", {}, None),
            ("configured", {"static_graph": True, "gradient_as_bucket_view": True},
             types.SimpleNamespace(name="t", configure_ddp=configure, user_files=frozenset(), user_dir=None))):
        torch.manual_seed(0)
        ddp = wrap(Block(), rank_ctx.device, kwargs, target=target)
        with FeatureProbe.watching(ddp) as probe:
            if label == "configured":
                with Join([ddp]):
                    ddp(torch.ones(2, 4)).sum().backward()
            else:
                ddp(torch.ones(2, 4)).sum().backward()
        out[label] = probe.result()
    return out


def test_ddp_object_features_found_on_ranks(suite_session):
    for result in suite_session.world().run(_rank_side):
        plain, configured = result.value["plain"], result.value["configured"]
        assert not any(f["used"] for f in plain.values()), plain
        assert plain["comm_hook"]["value"] == "DDP's all-reduce"
        assert configured["static_graph"] == {"used": True, "value": "True", "where": "the DDP object"}
        assert configured["gradient_as_bucket_view"]["used"]
        assert configured["comm_hook"] == {"used": True, "value": "fp16_compress_hook", "where": "configure_ddp"}
        assert configured["join"]["used"] and configured["join"]["value"] == (
            "around DistributedDataParallel, 1 block(s)")
        assert not configured["compiled"]["used"] and not configured["autocast"]["used"]


def test_compiled_found_inside_the_model_and_around_the_ddp_model():
    # torch.compile only wraps here (nothing is called, so nothing compiles).
    model = nn.Sequential(torch.compile(nn.Linear(4, 4), backend="eager"), nn.Linear(4, 2))
    with FeatureProbe.watching(model) as probe:
        pass
    assert probe.result()["compiled"] == {"used": True, "value": "inside the model: '0'", "where": "build_model"}
    around = torch.compile(Block(), backend="eager")  # as configure_ddp returning torch.compile(ddp_model)
    with FeatureProbe.watching(around) as probe:
        pass
    assert probe.result()["compiled"] == {"used": True, "value": "OptimizedModule around the DDP model",
                                          "where": "configure_ddp's return"}
    with FeatureProbe.watching(Block()) as probe:
        pass
    assert probe.result()["compiled"] == {"used": False, "value": "eager", "where": ""}
