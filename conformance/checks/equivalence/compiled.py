"""Compiled targets in the equivalence checks: compiled N-rank DDP against the *eager* reference,
with dynamo's graph breaks and DDP's bucket splits measured on the ranks.

A target is compiled in one of three places, all of which train through DDP:

- the DDP wrapper, production's usual order: ``configure_ddp`` returns
  ``torch.compile(ddp_model)``. Dynamo's DDPOptimizer (``torch._dynamo.config.optimize_ddp``)
  then splits the forward graph at DDP's bucket boundaries, so each bucket's all-reduce can
  start while the rest of the backward still runs (docs/ddp-background.md);
- the module inside DDP: ``build_model`` returns ``torch.compile(module)``. DDP's forward calls
  the compiled module, and DDPOptimizer splits it the same way (it acts whenever a compiled
  graph runs inside a DDP forward);
- compiled submodules (``self.blocks = torch.compile(blocks)``).

The reference of the equivalence checks runs the same target with every compiled region
executed eagerly (``torch.compiler.set_stance("force_eager")``: the same modules, the same
parameter names, no tracing), so the N-rank difference includes compile's own numerics:
*compiled vs eager DDP*. The floor twin of ``floor`` runs compiled like the N-rank run
(``RunPlan.eager`` False), so that compile's numerics are part of the floor it measures.

Measured on every compiling rank, per recorded run, from a cold dynamo cache
(``torch._dynamo.reset()`` first: a persistent rank process that ran this target in an earlier
check would otherwise reuse its compiled code and report no graph break at all):

- graph breaks: dynamo's ``GraphCompileReason`` records (``torch._dynamo.utils
  .graph_break_reasons``), grouped by the user's ``file:line``. Breaks whose stack never
  reaches user code are DDP's own (its forward calls a logger and a context manager dynamo
  will not trace when the wrapper is compiled) or DDPOptimizer's intentional splits: counted
  apart, never blamed on the target;
- bucket splits: how many subgraphs DDPOptimizer cut each compiled graph into (its
  ``buckets``, read after every ``DDPOptimizer.compile_fn``; torch 2.13 keeps them only on the
  optimizer instance, ``torch/_dynamo/backends/distributed.py``).

Functions here run inside rank processes (torch imported lazily), except ``compile_evidence``
and ``compile_warnings``, which the supervisor's judge calls on the ranks' summaries. (A rank
still compiling at a deadline is told from a hang by ``harness.failures.slow_compile_outcome``.)
"""

from __future__ import annotations

import contextlib
import os
import sysconfig
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from ddp_conformance.reports.keys import COMPILED, DDP_BUCKET_SPLITS, GRAPH_BREAKS

#: The forms, as the record names them.
WRAPPER = "torch.compile(ddp_model)"
MODULE = "torch.compile(module) inside DDP"
SUBMODULES = "compiled submodules inside DDP"
#: Graph-break reasons kept per site (dynamo often records 2-3 for one line: `.item()`, then
#: the builtins around it).
_REASONS_PER_SITE = 3


def is_compiled(module: Any) -> bool:
    """True for what ``torch.compile(module)`` returns (an ``OptimizedModule``)."""
    from torch._dynamo.eval_frame import OptimizedModule

    return isinstance(module, OptimizedModule)


def compiled_form(trained: Any, inner: Any) -> str | None:
    """Where the target compiles: ``trained`` is what the step gets (the DDP model or what
    ``configure_ddp`` returned), ``inner`` the module DDP wraps. None: nothing is compiled."""
    if is_compiled(trained):
        return WRAPPER
    if is_compiled(inner):
        return MODULE
    if any(is_compiled(m) for m in inner.modules()):
        return SUBMODULES
    return None


def output_site(trained: Any, inner: Any) -> Any:
    """The module whose forward hooks see the model's output *outside* any traced region.

    Under ``torch.compile(ddp_model)`` dynamo traces DDP's forward and the inner module's hooks
    with it: a hook that tests its output for NaN/Inf (a data-dependent ``bool``) would be a
    graph break of the suite's own making, and it would split the user's graph. The compiled
    wrapper's own hooks run eagerly around the compiled call, with the same output.
    """
    return trained if is_compiled(trained) else inner


def _backend_name(compiled: Any) -> str | None:
    # torch 2.13: OptimizedModule.dynamo_ctx.callback -> ConvertFrame -> the wrapped backend.
    backend = getattr(getattr(compiled, "dynamo_ctx", None), "callback", None)
    for _ in range(3):
        inner = getattr(backend, "_torchdynamo_orig_backend", None)
        if inner is None:
            break
        backend = inner
    name = getattr(backend, "compiler_name", None) or getattr(backend, "__name__", None)
    return str(name) if name else None


def _first_compiled(trained: Any, inner: Any) -> Any:
    if is_compiled(trained):
        return trained
    return next((m for m in inner.modules() if is_compiled(m)), None)


def _framework_dirs() -> tuple[str, ...]:
    """Files that are never the user's: torch, the standard library, this suite."""
    import torch

    suite = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return (os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
            os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep,
            os.path.join(suite, "conformance") + os.sep, os.path.join(suite, "faults") + os.sep,
            os.path.join(suite, "ddp_conformance") + os.sep)


def _user_site(frames: list[Any], framework: tuple[str, ...]) -> str | None:
    """``file:line`` of the innermost frame in the user's code, None when there is none."""
    for frame in reversed(frames):
        path = os.path.abspath(frame.filename)
        if frame.filename and not path.startswith(framework) and os.path.exists(path):
            return f"{os.path.basename(path)}:{frame.lineno}"
    return None


def _breaks(reasons: list[Any]) -> tuple[list[dict[str, Any]], int]:
    """Graph breaks in the user's code, one entry per ``file:line``, and how many were not."""
    framework = _framework_dirs()
    sites: dict[str, dict[str, Any]] = {}
    other = 0
    for reason in reasons:
        site = _user_site(list(reason.user_stack or []), framework)
        if site is None:
            other += 1
            continue
        entry = sites.setdefault(site, {"where": site, "count": 0, "reasons": []})
        entry["count"] += 1
        first = (reason.reason or "").strip().splitlines()[0][:160] if reason.reason else "?"
        if first not in entry["reasons"] and len(entry["reasons"]) < _REASONS_PER_SITE:
            entry["reasons"].append(first)
    return list(sites.values()), other


@contextlib.contextmanager
def _ddp_splits() -> Iterator[list[int]]:
    """Subgraphs per graph that DDPOptimizer compiles while the block runs.

    Patched on the class for the block only (a rank process is reused by later checks); the
    instance's ``buckets`` is what it split at, read after it compiled.
    """
    from torch._dynamo.backends.distributed import DDPOptimizer

    splits: list[int] = []
    original = DDPOptimizer.compile_fn

    def compile_fn(self: Any, gm: Any, example_inputs: Any) -> Any:
        compiled = original(self, gm, example_inputs)
        splits.append(len(getattr(self, "buckets", None) or [None]))
        return compiled

    DDPOptimizer.compile_fn = compile_fn  # type: ignore[method-assign,assignment]
    try:
        yield splits
    finally:
        DDPOptimizer.compile_fn = original  # type: ignore[method-assign]


@contextlib.contextmanager
def watch_compile(trained: Any, inner: Any, *, eager: bool) -> Iterator[dict[str, Any]]:
    """Run the block compiled as the target has it (and measure), or eagerly (``eager``).

    Yields a dict that is filled when the block ends: empty for a target that compiles
    nothing (nothing is reset, patched or reported), else the form, how it ran, and, when
    compiled, the graph breaks (in user code, and elsewhere), the graphs dynamo compiled and
    DDPOptimizer's splits.
    """
    import torch

    form = compiled_form(trained, inner)
    found: dict[str, Any] = {}
    if form is None:
        yield found
        return
    found.update(form=form, backend=_backend_name(_first_compiled(trained, inner)),
                 ran="eager" if eager else "compiled")
    if eager:
        # The reference: every compiled region runs its Python eagerly, same modules and names.
        with torch.compiler.set_stance("force_eager"):
            yield found
        return
    from torch._dynamo.utils import counters, graph_break_reasons

    # A cold cache: compiled code reused from an earlier check in this process would compile
    # nothing here, and "no graph break" would be a measurement of nothing.
    torch._dynamo.reset()
    start = len(graph_break_reasons)
    graphs = counters["stats"]["unique_graphs"]
    with _ddp_splits() as splits:
        yield found
    user, other = _breaks(list(graph_break_reasons[start:]))
    found.update(graphs=counters["stats"]["unique_graphs"] - graphs, graph_breaks=user,
                 other_breaks=other, optimize_ddp=str(torch._dynamo.config.optimize_ddp),
                 bucket_splits=splits)


def run_eagerly(*, eager: bool = True) -> Any:
    """Compiled regions run their Python eagerly inside the block (nothing is traced or
    compiled); a no-op for a target that compiles nothing."""
    import torch

    return torch.compiler.set_stance("force_eager") if eager else contextlib.nullcontext()


# -- supervisor side: the ranks' summaries into the record ----------------------------------

def compile_evidence(ranks: Sequence[Mapping[str, Any]], reference: Mapping[str, Any]) -> dict[str, Any]:
    """The record's evidence for a compiled target (empty for an eager one).

    ``COMPILED``: the form, the backend, how each side ran, graphs compiled per rank;
    ``GRAPH_BREAKS``: user-code breaks (``where``, ``count``, ``reasons``) seen on any rank;
    ``DDP_BUCKET_SPLITS``: subgraphs per compiled graph, per rank.
    """
    seen = [r.get("compile") or {} for r in ranks]
    if not any(seen):
        return {}
    head = next(s for s in seen if s)
    breaks: dict[str, dict[str, Any]] = {}
    for s in seen:
        for entry in s.get("graph_breaks") or []:
            kept = breaks.setdefault(entry["where"], dict(entry, count=0))
            kept["count"] = max(kept["count"], entry["count"])
    ref = reference.get("compile") or {}
    return {
        COMPILED: {"form": head.get("form"), "backend": head.get("backend"),
                   "ranks_ran": head.get("ran"), "reference_ran": ref.get("ran", "eager"),
                   "graphs_per_rank": [s.get("graphs") for s in seen],
                   "breaks_outside_user_code_per_rank": [s.get("other_breaks") for s in seen],
                   "optimize_ddp": head.get("optimize_ddp")},
        GRAPH_BREAKS: list(breaks.values()),
        DDP_BUCKET_SPLITS: [s.get("bucket_splits") or [] for s in seen],
    }


def compile_warnings(evidence: dict[str, Any]) -> list[str]:
    """What a passed record still says about compilation: graph breaks in the user's code, and
    a compiled model of which dynamo compiled nothing (it ran eagerly: a pass then says nothing
    about compiled code)."""
    said = []
    graphs = (evidence.get(COMPILED) or {}).get("graphs_per_rank") or []
    if graphs and all(g == 0 for g in graphs):
        # Seen with torch.compile(ddp_model) around an nn.Sequential: DDP's forward breaks the
        # graph before calling the module, and dynamo does not compile torch's own module frames.
        said.append("torch.compile compiled no graph on any rank: the model ran eagerly, so this "
                    "compared eager DDP with eager; compile a module of your own code (its forward "
                    "in your file), or compile the module inside DDP")
    breaks = evidence.get(GRAPH_BREAKS) or []
    if breaks:
        sites = ", ".join(f"{b['where']} ({'; '.join(b['reasons'])})" for b in breaks)
        said.append(f"torch.compile broke the graph at {len(breaks)} place(s) in the target's code: "
                    f"{sites}. Each break splits the compiled graph (and DDPOptimizer's bucket-aligned "
                    f"subgraphs) and runs Python between the pieces; move host syncs (.item(), print, "
                    f"data-dependent if) out of forward")
    return said
