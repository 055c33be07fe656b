"""``node-health``: the node, not the code — the rank that computes wrong, named (docs/node-health.md).

- :mod:`.check` — the entry (``run``) and :func:`measure` (one world call);
- :mod:`.rank` — what every rank runs: the same work, digested, gathered, compared;
- :mod:`.probes` — the value sites offered to a fault, the compute digests, the bucket digests;
- :mod:`.digests` — exact, order-sensitive digests and the difference of one tensor;
- :mod:`.compare` — majority, pair or set naming (pure);
- :mod:`.software` — the fingerprint compared first;
- :mod:`.judge` — the outcome; :mod:`.injected` — the injected-fault judge.
"""

from __future__ import annotations

from .check import REPEATS, measure, run
from .compare import MAJORITY, NO_MAJORITY, PAIR, STRUCTURE, Located, locate
from .injected import expected, judge_injected
from .judge import NodeDiagnosis, judge

__all__ = ["MAJORITY", "NO_MAJORITY", "PAIR", "REPEATS", "STRUCTURE", "Located", "NodeDiagnosis", "expected",
           "judge", "judge_injected", "locate", "measure", "run"]
