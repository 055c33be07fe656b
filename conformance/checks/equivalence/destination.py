"""Where one rank's recorded tensors go in an equivalence run: written as the reference's
snapshots, compared against them, or digested (``digests``) for a rank that cannot read them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .snapshots import SnapshotWriter, compare_snapshot
from .tensors import Compared


@dataclass
class Destination:
    """Where this rank's recorded gradients and parameters go: written (the reference, with
    ``writer``), compared against the reference's snapshots in ``folder`` (a rank that
    ``sees`` them), and digested too when some rank cannot (``digest``: every rank then
    digests the same points for the judge to carry the comparison over, ``digests``)."""

    folder: Path
    device: Any
    writer: SnapshotWriter | None
    sees: bool
    digest: bool
    record: bool  # this rank records at all (rank 0, or every rank with record_all_ranks)

    def gradients(self, label: str, named: list[tuple[str, Any]],
                  *, norms: dict[str, float | None] | None = None) -> list[Compared] | str | None:
        """``named`` at ``label``: written (its label: its norms once written, ``writer.norms``;
        ``norms``: those already measured, kept instead of measured again), compared (per-tensor
        summaries), or None (not recorded here)."""
        if not self.record or not self.sees:
            return None
        if self.writer is not None:
            self.writer.write(label, named, known=norms)
            return label
        return compare_snapshot(named, self.folder, label, self.device, grad=True)
