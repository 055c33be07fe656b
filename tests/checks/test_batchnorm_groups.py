"""gradient-equivalence on BatchNorm models whose BatchNorm rows are not the samples batch-first:
grouped by the samples each call holds, as observed (a pair packed per sample passes; it failed
"no known cause" when groups were counted in rows), and a BatchNorm whose rows mix samples is
inconclusive naming it (it failed as a loss that is not a mean over samples)."""

from __future__ import annotations

from ._check_helpers import target_spec


def _record(session, check_id, target):  # type: ignore[no-untyped-def]
    from conformance.harness.registry import BY_ID

    record, _ = session.run_check(BY_ID[check_id], target_spec(target))
    return record


def test_a_pair_packed_per_sample_is_grouped_by_sample(suite_session):
    record = _record(suite_session, "gradient-equivalence", "bn_pair_packed")
    assert record.status == "passed", record.message
    layouts = record.evidence["batchnorm_layouts"]
    assert layouts["reference"] == layouts["ranks"] == {
        name: {"rows_per_sample": 2, "arrangement": "sample-major"} for name in ("1", "4", "9")}
    # Each rank's calls hold its whole microbatch (both rows of each sample): normalised whole.
    assert record.evidence["batchnorm_sizes_seen"] == {"ranks": [[4], [4]], "reference": [4]}


def test_a_batchnorm_whose_rows_mix_samples_is_inconclusive_naming_it(suite_session):
    record = _record(suite_session, "gradient-equivalence", "bn_rows_mix_samples")
    assert record.status == "inconclusive", record.message
    assert record.message.startswith("the DDP step cannot be judged: BatchNorm 'norm' could not be "
                                     "grouped by sample alike in both runs (some of its rows depend "
                                     "on several samples (an op before it mixes samples)")
    assert "SyncBatchNorm" in record.recommendation
    assert record.evidence["batchnorm_layouts"]["reference"]["norm"]["unmapped"]
