"""Running one check on one target file through the shared test session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

TARGETS = Path(__file__).resolve().parents[1] / "targets"
BUILTINS = ("mlp", "tied-lm", "branchy", "convbn", "trainer")


def target_spec(name: str) -> str:
    """A built-in name as is, else the absolute path of tests/targets/<name>.py."""
    return name if name in BUILTINS else str(TARGETS / f"{name}.py")


def run_check(session: Any, check_id: str, target: str) -> Any:
    from conformance.harness.registry import BY_ID

    record, _ = session.run_check(BY_ID[check_id], target_spec(target))
    assert record.status != "inconclusive", record.evidence.get("harness_error", record.message)
    return record


def builds(ctx: Any, spec: str) -> int:
    """World work function: how often this rank process built ``spec``'s model with storage
    (a target that lists its builds' devices in ``BUILDS``, e.g. tests/targets/counted_builds.py;
    a build on the meta device, which sizes the model, holds none)."""
    from conformance.harness.targets import load_target

    return sum(device != "meta" for device in load_target(spec).module.BUILDS)
