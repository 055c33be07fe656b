"""Which production features a target uses, found at run time on a rank.

Production DDP rarely runs plain fp32 eager: autocast, a GradScaler, ``torch.compile``,
activation checkpointing, a comm hook, ``static_graph``, ``gradient_as_bucket_view``,
SyncBatchNorm, ``Join``. Each changes the numerics or has its own failure mode, so the report
says which ones the target actually used, and where (a configuration table per target).
Nothing here reads the target's source: the features are seen while the target's own step
runs, on the model, the step and the DDP object.

- autocast: ``torch.autocast.__enter__`` wrapped for the block — its dtype and device, and the
  ``file:line`` of the ``with`` (inside forward or around it alike);
- GradScaler: ``GradScaler.step`` wrapped — enabled or not, scale and growth interval at the
  first step, and the line that stepped it;
- activation checkpointing: the two implementations behind ``torch.utils.checkpoint.checkpoint``
  wrapped (not ``checkpoint`` itself: a target that did ``from torch.utils.checkpoint import
  checkpoint`` holds its own reference) — which modules, reentrant or not;
- Join: ``Join.__enter__`` wrapped (seen where the target's code enters one: ``run_loop``);
- compiled: an ``OptimizedModule`` around the DDP model (``configure_ddp`` returned
  ``torch.compile(ddp_model)``) or inside it;
- comm hook: the hook ``configure_ddp`` registered (``comm_hooks``);
- ``static_graph`` / ``gradient_as_bucket_view``: the DDP object's own state (``configure_ddp``
  may set static_graph after construction);
- SyncBatchNorm: a scan of the modules (``nn.SyncBatchNorm``, or on gloo the suite's CPU
  implementation standing in for it, ``sync_batchnorm``).

The wrappers are installed for the block only and restored however it ends (rank processes are
persistent and serve later checks). They record and call through: the step runs exactly as it
would. The result is plain Python (it crosses to the supervisor): per feature, ``used``,
``value`` and ``where``.
"""

from __future__ import annotations

import contextlib
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from ddp_conformance.reports.configuration import FEATURE_LABELS
from .patching import replaced as _replaced
from .sync_batchnorm import substituted

#: The features, in the order the report's configuration table lists them.
FEATURES = tuple(FEATURE_LABELS)

_TORCH = f"{os.sep}torch{os.sep}"
_HERE = str(Path(__file__).resolve())


def _caller() -> str:
    """``file:line`` of the innermost frame that is neither torch's nor this module's: the
    user's ``with torch.autocast(...)`` or ``scaler.step(optimizer)``."""
    from .target_calls import shown_path

    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_code.co_filename
        if _TORCH not in name and os.path.realpath(name) != _HERE:
            return f"{shown_path(name)}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return "?"


def checkpointed_module_name(fn: Any, names: dict[int, str]) -> str:
    """The module a checkpointed function belongs to (``blocks.0``), else its qualified name."""
    from torch import nn

    fn = getattr(fn, "func", fn)  # functools.partial
    owner = fn if isinstance(fn, nn.Module) else getattr(fn, "__self__", None)
    if isinstance(owner, nn.Module) and id(owner) in names:
        return names[id(owner)] or "<the model>"
    return str(getattr(fn, "__qualname__", type(fn).__name__))


def _listed(names: list[str], limit: int = 4) -> str:
    shown = ", ".join(f"'{n}'" for n in names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


@dataclass
class FeatureProbe:
    """What the block saw; :meth:`result` adds what the model and DDP object show."""

    trained: Any  # what train_step got: the DDP model, or a module around it
    seen: dict[str, dict[str, Any]] = field(default_factory=dict)
    checkpoints: dict[str, set[str]] = field(default_factory=lambda: {"reentrant": set(),
                                                                       "non-reentrant": set()})
    joins: int = 0

    @classmethod
    @contextlib.contextmanager
    def watching(cls, trained: Any) -> Iterator[FeatureProbe]:
        """Watch the target's step(s) run inside the block on ``trained``."""
        import torch.utils.checkpoint as cp
        from torch.amp.autocast_mode import autocast
        from torch.amp.grad_scaler import GradScaler
        from torch.distributed.algorithms.join import Join

        from .comm_hooks import ddp_of
        from .ddp import unwrap

        probe = cls(trained)
        names = {id(m): n for n, m in unwrap(ddp_of(trained)).named_modules()}

        def enter_autocast(original: Any) -> Any:
            def __enter__(self: Any) -> Any:
                if "autocast" not in probe.seen and getattr(self, "_enabled", True):
                    dtype = str(getattr(self, "fast_dtype", "?")).replace("torch.", "")
                    probe.seen["autocast"] = {"value": f"{dtype} ({self.device})", "where": _caller()}
                return original(self)
            return __enter__

        def scaler_step(original: Any) -> Any:
            def step(self: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
                if "grad_scaler" not in probe.seen:
                    enabled = self.is_enabled()
                    value = (f"scale {self.get_scale():g}, growth_interval "
                             f"{self.get_growth_interval()}" if enabled else "disabled")
                    probe.seen["grad_scaler"] = {"value": value, "where": _caller(), "used": enabled}
                return original(self, optimizer, *args, **kwargs)
            return step

        def reentrant_apply(original: Any) -> Any:
            def apply(function: Any, preserve: Any, *args: Any) -> Any:
                probe.checkpoints["reentrant"].add(checkpointed_module_name(function, names))
                return original(function, preserve, *args)
            return staticmethod(apply)

        def non_reentrant(original: Any) -> Any:
            def generator(fn: Any, *args: Any, **kwargs: Any) -> Any:
                probe.checkpoints["non-reentrant"].add(checkpointed_module_name(fn, names))
                return original(fn, *args, **kwargs)
            return generator

        def enter_join(original: Any) -> Any:
            def __enter__(self: Any) -> Any:
                probe.joins += 1
                if "join" not in probe.seen:
                    joinables = sorted({type(j).__name__ for j in getattr(self, "_joinables", [])})
                    probe.seen["join"] = {"value": f"around {', '.join(joinables) or 'no joinable'}",
                                          "where": _caller()}
                return original(self)
            return __enter__

        with _replaced(autocast, "__enter__", enter_autocast), \
                _replaced(GradScaler, "step", scaler_step), \
                _replaced(cp.CheckpointFunction, "apply", reentrant_apply), \
                _replaced(cp, "_checkpoint_without_reentrant_generator", non_reentrant), \
                _replaced(Join, "__enter__", enter_join):
            yield probe

    def result(self) -> dict[str, dict[str, Any]]:
        """Per feature (:data:`FEATURES`): ``{"used": bool, "value": str, "where": str}``."""
        from torch import nn

        from .comm_hooks import ddp_of, user_hook
        from .ddp import unwrap

        ddp = ddp_of(self.trained)
        inner = unwrap(ddp)
        out: dict[str, dict[str, Any]] = {}
        off = {"used": False, "value": "not used", "where": ""}

        for name in ("autocast", "grad_scaler"):
            seen = self.seen.get(name)
            out[name] = {"used": True, **seen} if seen else dict(off)
            if seen and "used" in seen:
                out[name]["used"] = bool(seen["used"])
        if "join" in self.seen:
            out["join"] = {"used": True, **self.seen["join"], "value":
                           f"{self.seen['join']['value']}, {self.joins} block(s)"}
        else:
            out["join"] = {"used": False, "value": "not seen", "where": "watched in run_loop"}

        compiled = [n or "<the model>" for n, m in inner.named_modules()
                    if type(m).__name__ == "OptimizedModule"]
        if self.trained is not ddp:
            out["compiled"] = {"used": True, "value": f"{type(self.trained).__name__} around the DDP model",
                               "where": "configure_ddp's return"}
        elif compiled:
            out["compiled"] = {"used": True, "value": f"inside the model: {_listed(compiled)}",
                               "where": "build_model"}
        else:
            out["compiled"] = dict(off, value="eager")

        kinds = [k for k in ("reentrant", "non-reentrant") if self.checkpoints[k]]
        out["checkpoint"] = ({"used": True, "value": " and ".join(kinds),
                              "where": "; ".join(f"{k}: {_listed(sorted(self.checkpoints[k]))}" for k in kinds)}
                             if kinds else dict(off))

        hook = user_hook(ddp)
        out["comm_hook"] = ({"used": True, "value": hook.name, "where": "configure_ddp"} if hook
                            else dict(off, value="DDP's all-reduce"))
        for attr in ("static_graph", "gradient_as_bucket_view"):
            on = bool(getattr(ddp, attr, False))
            out[attr] = {"used": on, "value": str(on), "where": "the DDP object"}

        sync = [n or "<the model>" for n, m in inner.named_modules() if isinstance(m, nn.SyncBatchNorm)]
        # On gloo the suite's CPU implementation stands in for nn.SyncBatchNorm (``sync_batchnorm``).
        cpu = [n or "<the model>" for n in substituted(inner)]
        value = f"{len(sync + cpu)} module(s)" + (" (on gloo: the suite's CPU implementation of its maths)" if cpu else "")
        out["sync_batchnorm"] = ({"used": True, "value": value, "where": _listed(sync + cpu)}
                                 if sync or cpu else dict(off))
        return {name: out[name] for name in FEATURES}
