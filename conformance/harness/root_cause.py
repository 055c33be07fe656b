"""One DDP error, one failed check: the first check that hits an error of DDP on a target names
it, and later checks that hit the same error say they could not run because of it.

A single error of DDP on the user's model (a buffer DDP cannot broadcast into, a reducer that
never finishes its reduction) stops every check that trains the model. Reported by each, it
fanned out into 5-8 failed or inconclusive checks on one run, each with advice of its own that
had nothing to do with the cause (measured on the word-language-model Transformer and a
siamese network: gradient-equivalence, no-sync-equivalence, rank-consistency, shared-weights
and hang-detection failed, straggler and bucket-config inconclusive, all on the same
``RuntimeError``). Now the run's session remembers, per target, the first failed record that
carries a DDP error raised on the ranks (``rank_errors``, written by ``failures.world_error_outcome``;
the equivalence checks' ``name_known_cause`` names known causes and re-runs their remedies); a later record on
the same target whose message (or own rank errors) carries the same error becomes
**inconclusive**: "could not run: blocked by <check> …", pointing at it, without advice of its own. The verdict is unchanged (the
root stays failed: not ready); a record that carries its own re-run remedies (unused-parameters'
diagnosis of the same error) keeps its status: it measured something of its own.

Scope: one session (one ``ddp-conformance run``; with pytest-xdist, one worker's checks).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from ddp_conformance.reports.keys import REMEDIES

from .outcome import Outcome

#: Evidence key of a record blocked by an earlier one.
BLOCKED_BY = "blocked_by"
#: Characters of the error's message that identify it (its first sentence, shortened: checks
#: quote DDP's messages cut at different lengths).
SIGNATURE_CHARS = 60

_ERROR = re.compile(r"\b([A-Z]\w*(?:Error|Exception)): (.+)")


def signature(described: str) -> str | None:
    """The identifying part of one rank's error (``"raised RuntimeError: Expected to …"``)."""
    match = _ERROR.search(described)
    if match is None:
        return None
    text = match.group(2).strip()
    return f"{match.group(1)}: {text[:SIGNATURE_CHARS]}" if len(text) >= 20 else None


@dataclass(frozen=True, slots=True)
class Root:
    check: str
    error: str  # the signature
    message: str  # the root record's message, shortened


@dataclass
class RootCauses:
    """Per target, the first DDP error a check failed on (see the module docstring)."""

    roots: dict[str, Root] = field(default_factory=dict)

    def relate(self, check: str, target: str, outcome: Outcome) -> Outcome:
        root = self.roots.get(target)
        if root is not None and root.check != check:
            return self._blocked(root, outcome)
        if root is None and outcome.status == "failed":
            errors = outcome.evidence.get("rank_errors") or {}
            sig = next((s for text in errors.values() if (s := signature(str(text)))), None)
            if sig is not None:
                self.roots[target] = Root(check, sig, outcome.message[:400])
        return outcome

    @staticmethod
    def _blocked(root: Root, outcome: Outcome) -> Outcome:
        if outcome.status not in ("failed", "inconclusive"):
            return outcome
        text = root.error.split(": ", 1)[1]
        # The same error raised on the ranks of this check's own run (an equivalence check names
        # the cause as the root did: once is enough), or quoted in its message.
        raised = any(text in str(e) for e in (outcome.evidence.get("rank_errors") or {}).values())
        if not raised and (REMEDIES in outcome.evidence or text not in outcome.message):
            return outcome
        return replace(
            outcome, status="inconclusive",
            message=(f"could not run: blocked by the DDP error that {root.check} reports on this "
                     f"target ({root.error}…); see {root.check}: {root.message}"),
            metrics={**outcome.metrics, "key_figure": f"blocked by {root.check}"},
            evidence={**outcome.evidence, BLOCKED_BY: {"check": root.check, "error": root.error,
                                                       "own_message": outcome.message[:2000]}},
            recommendation=f"fix what {root.check} reports; this check runs once that error is gone")
