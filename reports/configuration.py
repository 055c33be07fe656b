"""The configuration table of each target: which production features it used, and what was
verified for each.

The equivalence checks see the features while the target's own step runs on the ranks
(``conformance/harness/features.py``, evidence :data:`~reports.keys.FEATURES`). Each row says
the feature, its value, where it was found, and what was *verified* with it active: the checks
whose run saw it and their status, plus the feature's own figure where a check measured one —
the noise floor the numerics were judged against (autocast, GradScaler), the comm hook's
compression error and bound, torch.compile's graph breaks and DDP bucket splits, a recommended
change re-run (checkpointing, static_graph). A feature no check saw active says so: "not
verified by any check". Rendered by :mod:`reports.markdown` and :mod:`reports.html`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .keys import COMPILED, DDP_BUCKET_SPLITS, FEATURES, GRAPH_BREAKS, NOISE_FLOOR, REMEDIES, STEP_COLLECTIVES

#: The features, in the order of the table, and their names in it (the rank-side probe
#: reports them in this order too).
FEATURE_LABELS = {"autocast": "autocast", "grad_scaler": "GradScaler", "compiled": "torch.compile",
                  "checkpoint": "activation checkpointing", "comm_hook": "comm hook",
                  "static_graph": "static_graph", "gradient_as_bucket_view": "gradient_as_bucket_view",
                  "sync_batchnorm": "SyncBatchNorm", "join": "Join"}
NOT_VERIFIED = "not verified by any check"
#: The row of the collectives the step itself called (``_collectives_row``).
COLLECTIVES_LABEL = "collectives in the step"
#: Which recommended changes (``REMEDIES``) speak for which feature.
_REMEDY_WORDS = {"checkpoint": ("reentrant", "checkpoint", "static_graph"), "static_graph": ("static_graph",)}


@dataclass(frozen=True)
class Row:
    feature: str
    value: str
    where: str
    used: bool
    verified: str


@dataclass(frozen=True)
class Table:
    target: str
    rows: tuple[Row, ...]


def _g(value: Any) -> str:
    return f"{value:.2g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "?"


def _evidence(record: Mapping[str, Any]) -> Mapping[str, Any]:
    evidence = record.get("evidence")
    return evidence if isinstance(evidence, Mapping) else {}


def _floor_figure(records: list[Mapping[str, Any]]) -> str:
    parts = []
    for r in records:
        floor = _evidence(r).get(NOISE_FLOOR)
        if not isinstance(floor, Mapping) or not floor.get("measured"):
            continue
        grads = floor.get("gradients")
        if isinstance(grads, Mapping):
            parts.append(f"{r.get('id')}: noise floor {_g(grads.get('floor_rel'))} × margin "
                         f"{_g(floor.get('margin'))}, observed {_g(grads.get('observed_rel'))}")
    return "; ".join(parts)


def _compression_figure(records: list[Mapping[str, Any]]) -> str:
    parts = []
    for r in records:
        floor = _evidence(r).get(NOISE_FLOOR)
        hook = floor.get("compression") if isinstance(floor, Mapping) else None
        if isinstance(hook, Mapping):
            within = "within" if hook.get("within_bound") else "beyond"
            parts.append(f"{r.get('id')}: compression error {_g(hook.get('error_rel'))} {within} "
                         f"bound {_g(hook.get('bound_rel'))}")
    return "; ".join(parts)


def _compile_figure(records: list[Mapping[str, Any]]) -> str:
    for r in records:
        evidence = _evidence(r)
        if isinstance(evidence.get(COMPILED), Mapping):
            breaks = evidence.get(GRAPH_BREAKS) or []
            splits = [n for rank in evidence.get(DDP_BUCKET_SPLITS) or [] for n in rank or []]
            return (f"{r.get('id')}: {sum(int(b.get('count') or 0) for b in breaks if isinstance(b, Mapping))} "
                    f"graph break(s) in your code, DDP bucket splits {max(splits) if splits else 0}")
    return ""


def _remedy_figure(feature: str, records: list[Mapping[str, Any]]) -> str:
    words = _REMEDY_WORDS.get(feature, ())
    parts = [f"{remedy.get('change')}: {remedy.get('status')}"
             for r in records for remedy in _evidence(r).get(REMEDIES) or []
             if isinstance(remedy, Mapping) and any(w in str(remedy.get("change")) for w in words)]
    return "; ".join(parts)


def _figure(feature: str, with_it: list[Mapping[str, Any]], all_records: list[Mapping[str, Any]]) -> str:
    if feature in ("autocast", "grad_scaler"):
        return _floor_figure(with_it)
    if feature == "comm_hook":
        return _compression_figure(with_it)
    if feature == "compiled":
        return _compile_figure(with_it)
    # A re-run of a remedy can be recorded by a check that failed before it saw the features.
    return _remedy_figure(feature, all_records)


def _row(feature: str, label: str, records: list[Mapping[str, Any]],
         all_records: list[Mapping[str, Any]]) -> Row:
    found = [(r, _evidence(r)[FEATURES].get(feature)) for r in records]
    seen = [(r, f) for r, f in found if isinstance(f, Mapping)]
    used = [(r, f) for r, f in seen if f.get("used")]
    shown = (used or seen)[0][1] if seen else {}
    with_it = [r for r, _ in used]
    ran = ", ".join(f"{r.get('id')} {r.get('status')}" for r in with_it)
    figure = _figure(feature, with_it, all_records) if used else ""
    # Only a check that passed or failed judged the run it saw the feature in; an
    # inconclusive or skipped one verified nothing, and the row says so.
    judged = any(r.get("status") in ("passed", "failed") for r in with_it)
    if not used:
        verified = "—"
    elif judged or figure:
        verified = " · ".join(p for p in (ran, figure) if p)
    else:
        verified = f"{NOT_VERIFIED} ({ran})" if ran else NOT_VERIFIED
    return Row(feature=label, value=str(shown.get("value") or "—"), where=str(shown.get("where") or "—"),
               used=bool(used), verified=verified)


def _collectives_row(records: list[Mapping[str, Any]]) -> Row | None:
    """The collectives the step called in its forward, loss and autograd.Function backwards
    (evidence :data:`~reports.keys.STEP_COLLECTIVES`), as the first record that saw them has
    them; None when no record watched them."""
    watched = [r for r in records if isinstance(_evidence(r).get(STEP_COLLECTIVES), list)]
    if not watched:
        return None
    calls: list[Any] = next((_evidence(r)[STEP_COLLECTIVES] for r in watched if _evidence(r)[STEP_COLLECTIVES]), [])
    seen: dict[str, int] = {}
    for c in calls:
        if isinstance(c, Mapping):
            how = "" if c.get("differentiable") else ", not differentiable"
            grad = ", input requires grad" if c.get("requires_grad") else ""
            label = f"{c.get('op')} {list(c.get('shape') or [])} ({c.get('api')}{how}{grad}; {c.get('phase')})"
            seen[label] = seen.get(label, 0) + 1
    value = "; ".join(f"{label}{f' ×{k}' if k > 1 else ''}" for label, k in seen.items()) or "none"
    where = sorted({str(c.get("where")) for c in calls if isinstance(c, Mapping)})
    used = [r for r in watched if _evidence(r)[STEP_COLLECTIVES]]
    return Row(feature=COLLECTIVES_LABEL, value=value, where="; ".join(where) or "—", used=bool(used),
               verified=", ".join(f"{r.get('id')} {r.get('status')}" for r in used) if used else "—")


def tables(report: Mapping[str, Any]) -> list[Table]:
    """One table per target whose records carry the features a run saw (none: no table)."""
    checks = [c for c in report.get("checks") or [] if isinstance(c, Mapping)]
    by_target: dict[str, list[Mapping[str, Any]]] = {}
    for c in checks:
        by_target.setdefault(str(c.get("target") or report.get("target") or "?"), []).append(c)
    out = []
    for target, records in by_target.items():
        probed = [r for r in records if isinstance(_evidence(r).get(FEATURES), Mapping)]
        if probed:
            rows = [_row(f, label, probed, records) for f, label in FEATURE_LABELS.items()]
            collectives = _collectives_row(probed)
            out.append(Table(target, tuple(rows + ([collectives] if collectives else []))))
    return out
