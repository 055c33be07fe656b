"""The gradients before ``clip_grad_norm_`` clipped them, at the first step that ran: a probe
of the recorded run (``recording``), written as the reference's snapshot ``pre_clip0`` or
compared against it, where the tensors are."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any

from ...harness.observe import Probe, Slice, Step
from ...harness.parallel import full_named
from .destination import Destination
from .digests import named_digests
from .instruments import ClipProbe
from .records import ClipSlice
from .snapshots import compare_snapshot, has_snapshot

#: Snapshot label of the reference's gradients before the first step's last clip (``snapshots``).
PRE_CLIP0 = "pre_clip0"


@dataclass
class Clipping(Probe):
    """``clip_grad_norm_`` observed (``ClipProbe``): what it measured per step, and the
    gradients before the last clip of the first step that ran, written or compared
    (``take``n by the gradient recorder once that step ran)."""

    inner: Any
    namespaces: list[dict[str, Any]]
    to: Destination
    probe: ClipProbe | None = None
    done: bool = False
    found: dict[str, Any] = field(default_factory=dict)  # "pre_clip", "pre_clip_digest"
    calls: list[list[dict[str, float]]] = field(default_factory=list)

    def attach(self, stack: contextlib.ExitStack) -> None:
        self.probe = ClipProbe.attach(self.inner, self.namespaces, observe=self._observe)
        stack.callback(self.probe.close)

    def _observe(self, named: list[tuple[str, Any]]) -> None:
        # Every clip before the first step overwrites the last: the last clip's input counts.
        # Gathered before anything returns: every rank clips, every rank joins the all-gathers.
        named = list(full_named(named))
        if not self.to.record:
            return
        if self.to.digest:
            self.found["pre_clip_digest"] = named_digests(named)
        if self.to.writer is not None:
            self.to.writer.write(PRE_CLIP0, named)
            self.found["pre_clip"] = PRE_CLIP0
        elif self.to.sees and has_snapshot(self.to.folder, PRE_CLIP0):
            self.found["pre_clip"] = compare_snapshot(named, self.to.folder, PRE_CLIP0, self.to.device, grad=True)

    def begin_step(self, step: Step) -> None:
        assert self.probe is not None
        self.probe.calls = []
        if not self.done:
            self.found.clear()
            self.probe.frozen = False

    def end_step(self, step: Step) -> Slice:
        assert self.probe is not None
        self.calls.append(list(self.probe.calls))
        return {}  # the steps are a list in ``result``

    def take(self) -> dict[str, Any]:
        """What the first step that ran saw before clipping; later clips are not recorded."""
        assert self.probe is not None
        self.done = self.probe.frozen = True
        return self.found

    def result(self) -> ClipSlice:
        return ClipSlice(clip_calls=self.calls)
