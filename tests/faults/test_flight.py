"""torch's flight recorder, read as the suite reads it: the dump's shape on torch 2.13 (gloo),
summarised per scenario. The NCCL recorder is tested in test_gpu.py."""

from __future__ import annotations

import json
from typing import Any

from ddp_conformance.faults import _flight


def _entry(pg: str, seq: int, created: int, op: str = "gloo:all_reduce", retired: bool = True) -> dict[str, Any]:
    # The fields torch 2.13's _dump_fr_trace_json() gives a gloo entry (measured), trimmed.
    return {"collective_seq_id": seq, "input_dtypes": ["Float"], "input_sizes": [[8]], "is_p2p": False,
            "op_id": seq, "output_sizes": [[8]], "p2p_seq_id": 0, "pg_id": int(pg),
            "process_group": [pg, "undefined"], "profiling_name": op, "record_id": seq,
            "retired": retired, "state": "scheduled", "time_created_ns": created,
            "time_discovered_completed_ns": 0, "time_discovered_started_ns": 0, "timeout_ms": 2000}


def _dump() -> dict[str, Any]:
    return {"version": "2.10", "pg_config": {}, "nccl_comm_state": {}, "comm_lib_version": "",
            "entries": [_entry("1", 1, 100), _entry("1", 2, 110),          # an earlier scenario, hung
                        _entry("0", 1, 990, "gloo:barrier"),               # warm-up, before this one
                        _entry("2", 1, 1000), _entry("2", 2, 1010, retired=True)],
            "pg_status": {"0": {"last_enqueued_collective": "1", "last_completed_collective": "1"},
                          "1": {"last_enqueued_collective": "2", "last_completed_collective": "1"},
                          "2": {"last_enqueued_collective": "2", "last_completed_collective": "1",
                                "last_started_collective": "-1"}}}


def test_summary_keeps_this_scenarios_groups_and_reads_pending_from_pg_status() -> None:
    s = _flight.summarize(_dump(), since_ns=1000, groups=["2"])
    assert s is not None and set(s["groups"]) == {"2"}  # the stale hung group "1" is left out
    assert s["groups"]["2"]["last_enqueued"] == 2 and s["groups"]["2"]["last_completed"] == 1
    # retired=True on #2 (it timed out) does not make it completed: pg_status decides
    pending = _flight.pending(s)
    assert pending is not None
    assert (pending["seq"], pending["op"], pending["input_sizes"]) == (2, "gloo:all_reduce", [[8]])
    assert [e["seq"] for e in s["entries"]] == [1, 2]
    assert _flight.summarize(_dump(), since_ns=0, last=2)["entries"][-1]["seq"] == 2
    json.dumps(s)  # it travels back from the rank and into the report


def test_nothing_pending_and_no_recorder() -> None:
    done = _dump()
    done["pg_status"]["2"]["last_completed_collective"] = "2"
    assert _flight.pending(_flight.summarize(done, since_ns=1000)) is None
    assert _flight.summarize(None) is None and _flight.pending(None) is None


def test_gloo_recorder_is_readable_on_this_torch() -> None:
    """The API the ranks call exists here and returns JSON (no world needed: an empty recorder
    still dumps its header; entries appear with the first collective, see the chaos test)."""
    raw = _flight.dump("gloo")
    assert raw is not None and "pg_status" in raw and "version" in raw
    assert _flight.pending(_flight.summarize(raw)) is None


class _Tracker:
    """The two things InFlightSnapshot reads from a CollectiveTracker."""

    def __init__(self, open_seq: int | None, age_s: float, completed: tuple[int, ...] = ()) -> None:
        import time

        self._open = None if open_seq is None else (open_seq, time.perf_counter() - age_s)
        self.records = [{"event": "completed", "seq": s} for s in completed]

    def oldest_open(self):  # type: ignore[no-untyped-def]
        return self._open


def test_snapshot_is_taken_while_in_flight_and_kept_only_if_it_never_completed(  # type: ignore[no-untyped-def]
        monkeypatch) -> None:
    import time

    in_flight, after = _dump(), _dump()
    # gloo after the timeout: the failed #2 counts as completed -- the recorder forgot it was stuck
    after["pg_status"]["2"]["last_completed_collective"] = "2"
    dumps = iter([in_flight, after, after])
    monkeypatch.setattr(_flight, "dump", lambda backend: next(dumps))

    stuck = _flight.InFlightSnapshot(_Tracker(2, age_s=5.0), "gloo", since_ns=1000, poll_s=0.01)
    with stuck:
        time.sleep(0.1)
    got = stuck.result()
    assert got is not None and got["taken"].startswith("in flight") and _flight.pending(got)["seq"] == 2

    dumps = iter([in_flight, after])
    slow_but_done = _flight.InFlightSnapshot(_Tracker(2, age_s=5.0, completed=(2,)), "gloo", since_ns=1000,
                                             poll_s=0.01)
    with slow_but_done:
        time.sleep(0.1)
    got = slow_but_done.result()
    assert got is not None and got["taken"] == "after the scenario" and _flight.pending(got) is None
