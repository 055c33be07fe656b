"""ddp-conformance: a conformance and chaos test suite for PyTorch DDP deployments.

The check framework (import-light: nothing here imports torch):
- :mod:`conformance.harness.registry` — every check id and where its code lives;
- :mod:`conformance.harness.world` — supervised rank processes (``World``) and attach mode;
- :mod:`conformance.targets` — loading and validating what is checked;
- :mod:`conformance.checks` — the conformance checks (judges).
"""

from __future__ import annotations

from .harness.outcome import Outcome
from .harness.registry import BY_ID, CHECKS, CheckSpec, select

__version__ = "0.1.0"
__all__ = ["BY_ID", "CHECKS", "CheckSpec", "Outcome", "select", "__version__"]
