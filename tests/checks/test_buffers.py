"""A buffer DDP's broadcast refuses (``equivalence.buffers``): the raw "some elements ... refer to a single
memory location" of every check that trains the model becomes the buffer named with its
strides, and forward_sync_buffers=False re-run against the reference."""

from __future__ import annotations

from conformance.harness.remedies import NOT_VERIFIED, VERIFIED
from ddp_conformance.reports.keys import REMEDIES

from ._check_helpers import run_check


def test_a_buffer_with_strides_ddp_cannot_broadcast_into_is_named(suite_session):
    # Before: "the DDP training step raised on rank 0: raised RuntimeError: unsupported
    # operation: some elements of the input tensor and the written-to tensor refer to a single
    # memory location. Please clone() the tensor ...", with no cause and no advice.
    record = run_check(suite_session, "gradient-equivalence", "strided_buffer")
    assert record.status == "failed"
    assert record.message.startswith("DDP cannot broadcast into buffer pe (shape (5, 1, 8), strides "
                                     "(8, 40, 1), plain (8, 8, 1))")
    assert [b["name"] for b in record.evidence["unbroadcastable_buffers"]] == ["pe"]
    remedies = {r["change"]: r["status"] for r in record.evidence[REMEDIES]}
    assert remedies == {"forward_sync_buffers=False": VERIFIED, "buffers with plain strides": NOT_VERIFIED}
    assert record.recommendation is not None and record.recommendation.startswith("register pe with plain strides")
