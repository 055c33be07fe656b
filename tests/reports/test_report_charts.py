"""Charts: drawn from well-formed metrics, silently absent for malformed ones, never a crash."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from ddp_conformance.reports import charts, keys
from ddp_conformance.reports.schema import CheckRecord
from tests.reports._runs import write_run
from tests.reports.sample import sample_run


def _sample_checks() -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    _, records, events = sample_run()
    return {r.id: r.to_json() for r in records}, [e.to_json() for e in events]


@pytest.mark.parametrize(("check_id", "titles"), [
    ("bucket-config", ["Bucket-size sweep"]),
    ("straggler", ["Straggler: per-rank compute vs wait", "Timeline"]),
    ("allreduce-bandwidth", ["All-reduce bandwidth", "Scaling projection"]),
    ("hang-detection", ["Timeline"]),
    ("gradient-equivalence", []),
])
def test_sample_checks_get_their_charts(check_id: str, titles: list[str]) -> None:
    checks, events = _sample_checks()
    drawn = charts.charts_for(checks[check_id], events)
    assert [c["title"] for c in drawn] == titles
    for chart in drawn:
        assert str(chart["svg"]).startswith("<svg") and "http" not in str(chart["svg"])


def test_bucket_sweep_marks_configured_and_best_on_a_log_axis() -> None:
    checks, _ = _sample_checks()
    svg = str(charts.bucket_sweep(checks["bucket-config"]["metrics"])["svg"])
    assert "configured 25 MB" in svg and "best 50 MB" in svg and "log scale" in svg


def test_timeline_shades_only_overlapping_events_of_its_check() -> None:
    metrics = {"timeline": [{"rank": 0, "step": 0, "t_start": 10.0, "t_end": 11.0}]}
    inside = {"name": "slow-rank", "t_start": 10.2, "t_end": 10.4, "check": "x"}
    outside = {"name": "late", "t_start": 50.0, "t_end": 51.0, "check": "x"}
    other = {"name": "other-check", "t_start": 10.2, "t_end": 10.4, "check": "y"}
    drawn = charts.charts_for({"id": "x", "metrics": metrics}, [inside, outside, other])
    svg = str(drawn[0]["svg"])
    assert svg.count('class="fault"') == 1 and "slow-rank" in svg


def test_culprit_rank_is_outlined() -> None:
    metrics = {"per_rank": [{"rank": r, "compute_s": 0.1, "wait_s": 0.01} for r in range(4)], "culprit_rank": 2}
    assert str(charts.straggler(metrics)["svg"]).count('class="bar culprit"') == 1


MALFORMED: list[Any] = [
    None, "sweep", 3, [], {}, [None], ["x"], [{"bucket_cap_mb": "25"}], [{"bucket_cap_mb": float("nan"), "step_time_s": 1}],
    [{"bucket_cap_mb": -1, "step_time_s": 1}, {"bucket_cap_mb": 0, "step_time_s": 2}],
    [{"bucket_cap_mb": 25, "step_time_s": 1}],  # one point is not a curve
    [{"bytes": 1e400, "busbw_gbps": 1}], [{"rank": True, "compute_s": 1, "wait_s": 1}],
    [{"rank": 0, "step": 0, "t_start": 5, "t_end": 1}],
]


@pytest.mark.parametrize("bad", MALFORMED, ids=repr)
@pytest.mark.parametrize("key", ["sweep", "per_rank", "projection", "timeline", "resume_trajectories"])
def test_malformed_metrics_cost_the_chart_not_the_report(key: str, bad: Any) -> None:
    check = {"id": "x", "metrics": {key: bad, "configured_bucket_cap_mb": "x", "culprit_rank": [], "cliff_world_size": "?"}}
    for chart in charts.charts_for(check, [{"check": "x", "t_start": "soon"}, None, 3]):
        assert str(chart["svg"]).startswith("<svg")


def test_flat_series_and_single_rank_do_not_divide_by_zero() -> None:
    flat = {"sweep": [{"bucket_cap_mb": 25, "step_time_s": 0.0}, {"bucket_cap_mb": 25, "step_time_s": 0.0}]}
    assert charts.bucket_sweep(flat) is not None
    one = {"per_rank": [{"rank": 0, "compute_s": 0.0, "wait_s": 0.0}]}
    assert charts.straggler(one) is not None
    instant = {"timeline": [{"rank": 0, "step": 0, "t_start": 1.0, "t_end": 1.0}]}
    assert charts.timeline(instant, []) is not None


def test_chart_text_is_escaped() -> None:
    metrics = {"timeline": [{"rank": 0, "step": 0, "t_start": 0.0, "t_end": 1.0}]}
    event = {"name": "<script>alert(1)</script>", "t_start": 0.2, "t_end": 0.4, "check": "x"}
    svg = str(charts.charts_for({"id": "x", "metrics": metrics}, [event])[0]["svg"])
    assert "<script>" not in svg and "&lt;script&gt;" in svg


def _cliff_metrics() -> dict[str, Any]:
    rows = [{"rate_gbps": None, "measured_step_s": 0.010, "predicted_step_s": 0.010, "compute_s": 0.008,
             "overhead_s": 0.001}]
    for rate, step, pred in ((1.0, 0.010, 0.0105), (0.25, 0.013, 0.012), (0.06, 0.030, 0.028)):
        rows.append({"rate_gbps": rate, "measured_step_s": step, "predicted_step_s": pred, "compute_s": 0.008,
                     "overhead_s": 0.001})
    return {"cliff_sweep": rows, "cliff_knee": {"measured_gbps": 0.25, "predicted_gbps": 0.06},
            "cliff_max_error": 0.077, "cliff_ratio": 3.0, "cliff_simulator_validated": True}


def test_the_cliff_chart_stacks_compute_and_exposed_comm_and_marks_both_knees() -> None:
    chart = charts.link_cliff(_cliff_metrics())
    svg = str(chart["svg"])
    assert "knee (measured)" in svg and "knee (predicted)" in svg and "slower to the right" in svg
    assert svg.count('<g class="bar">') == 3  # the shaped rates only: the unshaped has no rate
    assert "exposed comm 21.0 ms" in svg  # 30 ms step - 8 ms compute - 1 ms DDP fixed cost
    assert chart["caption"] == "3 shaped rates; step x3.00 at the lowest rate; simulator max error 8% (validated)"
    assert [c["title"] for c in charts.charts_for({"id": "scaling-cliff", "metrics": _cliff_metrics()})] == \
        ["Scaling cliff"]


@pytest.mark.parametrize("bad", [None, [], [{"rate_gbps": "x"}], [{"rate_gbps": 1.0, "measured_step_s": 0.01}]])
def test_a_malformed_cliff_sweep_costs_only_the_chart(bad: Any) -> None:
    assert charts.link_cliff({"cliff_sweep": bad}) is None
def test_resume_trajectories_mark_the_kill_and_the_first_divergence() -> None:
    run = {"uninterrupted": [1.0, 1.1, 1.2, 1.3, 1.4, 1.5], "before_kill": [1.0, 1.1, 1.2],
           "resumed_from": 3, "resumed": [1.25, 1.35, 1.45, 1.55], "kill_after": 3, "kill": "after-step"}
    torn = {**run, "before_kill": [1.0, 1.1, 1.2, 1.3], "kill_after": 4, "kill": "during-save"}
    metrics = {"resume_trajectories": {"killed-between-steps": run, "killed-during-save": torn},
               "first_divergence": {"what": "optimizer", "step": 3, "rank": 0}}
    drawn = charts.charts_for({"id": "resume-equivalence", "metrics": metrics})
    assert [c["title"] for c in drawn] == ["Resume trajectories"]
    svg = str(drawn[0]["svg"])
    assert "kill after step 3" in svg and "killed-between-steps: restarted" in svg and "stroke-dasharray" in svg
    assert ">kill during the save after step 4<" in svg
    # The kills' words sit below the legend's row, not on it.
    legend_y = {float(y) for y in re.findall(r'<text class="legend" x="[\d.]+" y="([\d.]+)"', svg)}
    label_y = [float(y) for y in re.findall(r'<text class="bad-label" x="[\d.]+" y="([\d.]+)"', svg)]
    assert len(label_y) == 2 and min(label_y) > max(legend_y) + 10, (legend_y, label_y)
    assert drawn[0]["caption"] == "first divergence: optimizer at step 3 on rank 0"
    broken = {"resume_trajectories": {"x": {**run, "uninterrupted": [1.0, "nan?"], "resumed": None}}}
    assert charts.resume_trajectories(broken) is None


# -- what a reader of report.html sees (issue 38) ------------------------------------------------

def _chart_svg(page: str, title: str) -> str:
    """The one inline SVG of report.html whose title is ``title``."""
    svgs = re.findall(r"<svg class=\"chart\".*?</svg>", page, flags=re.S)
    found = [s for s in svgs if f"<title>{title}" in s]
    assert len(found) == 1, [re.search(r"<title>(.*?)</title>", s).group(1) for s in svgs]  # type: ignore[union-attr]
    return found[0]


def test_a_narrow_axis_far_from_zero_has_distinct_tick_labels(tmp_path: Path) -> None:
    # A resume run whose parameter norm moves in the fourth decimal around 10.43 (what a small
    # learning rate on a real model gives): the y axis used to read "10.43" five times.
    norms = [10.43012, 10.43035, 10.43061, 10.43088, 10.43101, 10.43118]
    run = {"uninterrupted": norms, "before_kill": norms[:3], "resumed_from": 4, "resumed": norms[3:],
           "kill_after": 3, "kill": "after-step"}
    record = CheckRecord("resume-equivalence", "Resume equivalence", "conformance", "passed", 9.0,
                         "killed-between-steps: resumed at step 4, equal to step 6 on 2 ranks",
                         metrics={keys.RESUME_TRAJECTORIES: {"killed-between-steps": run}})
    write_run(tmp_path, [record])
    svg = _chart_svg((tmp_path / "report.html").read_text(), "Resume: parameter norm")
    ticks = re.findall(r'<text class="tick" x="[\d.]+" y="[\d.]+" text-anchor="end">([^<]*)</text>', svg)
    assert len(ticks) >= 3, svg
    assert len(set(ticks)) == len(ticks), ticks
    assert all(abs(float(t) - 10.43) < 0.01 for t in ticks), ticks


def test_a_projection_the_message_calls_unreliable_is_not_drawn_as_a_prediction(tmp_path: Path) -> None:
    # allreduce-bandwidth as it ran on a loaded 2-core host (its metrics as written there): the
    # message says the projection is unreliable; the chart must not show a solid efficiency curve.
    projection = [{"world_size": 2 ** k, "step_time_s": 1.5e-4 * 2 ** k, "efficiency": round(1 / 2 ** k, 4)}
                  for k in range(11)]
    record = CheckRecord(
        "allreduce-bandwidth", "All-reduce bandwidth", "perf", "passed", 1.3,
        "all 260 results exact; busbw 1.36 GB/s @16 MiB; alpha 76.8 us, beta 1.01 GB/s; projection unreliable "
        "here: the simulator is off by 74% against the measured DDP step at 2 ranks (bound 25%), so no scaling "
        "cliff is claimed",
        metrics={"projection": projection, keys.PROJECTION_RELIABLE: False, keys.SIMULATOR_ERROR: 0.74,
                 keys.CLIFF_WORLD_SIZE: None, "unconfirmed_cliff_world_size": 2})
    write_run(tmp_path, [record])
    page = (tmp_path / "report.html").read_text()
    svg = _chart_svg(page, "Scaling projection")
    series = re.findall(r'<polyline class="series"[^>]*>', svg)
    assert series and all("stroke-dasharray" in s for s in series), series  # no solid curve
    assert "cliff at" not in svg
    assert "UNRELIABLE" in svg and "not a prediction" in svg
    assert "not a prediction: the simulator is off by 74%" in page  # the caption says why


def test_a_reliable_projection_is_still_drawn_solid_with_its_cliff() -> None:
    checks, _ = _sample_checks()
    chart = charts.scaling(checks["allreduce-bandwidth"]["metrics"])
    assert chart is not None and chart["title"] == "Scaling projection"
    svg = str(chart["svg"])
    assert "cliff at 512 ranks" in svg and "UNRELIABLE" not in svg
    assert all("stroke-dasharray" not in s for s in re.findall(r'<polyline class="series"[^>]*>', svg))
