"""Run metrics on hand-computed outcomes: exact averages, P99.9 (numpy linear), utilization, counts."""

from __future__ import annotations

import pytest

from lucid_core.sim.metrics import (
    compute_metrics,
    per_vc_table,
    tail,
    time_weighted_utilization,
    utilization_over_time,
)
from lucid_core.sim.records import JobOutcome

# job: vc, gpus, submit, duration, start, end, queue   -> JCT
OUTCOMES = [
    JobOutcome("a", "v1", 1, 0.0, 100.0, 0.0, 100.0, 0.0),  # 100
    JobOutcome("b", "v1", 2, 10.0, 30.0, 50.0, 80.0, 40.0, shared_seconds=5.0),  # 70
    JobOutcome("c", "v2", 1, 20.0, 50.0, 20.0, 70.0, 0.0, ended_in_profiling=True, profiled=True),  # 50
    JobOutcome("d", "v2", 4, 30.0, 400.0, 120.0, 520.0, 90.0, preemptions=2),  # 490
]
TIMELINE = [(0.0, 1), (10.0, 2), (50.0, 4), (70.0, 3), (80.0, 1), (100.0, 0), (120.0, 4), (520.0, 0)]


def test_averages_tails_and_counts_are_exact():
    m = compute_metrics(OUTCOMES, TIMELINE, total_gpus=8)
    assert m["jobs"] == 4
    assert m["avg_jct_s"] == pytest.approx((100 + 70 + 50 + 490) / 4)
    assert m["avg_jct_h"] == pytest.approx(177.5 / 3600)
    assert m["avg_queue_s"] == pytest.approx((0 + 40 + 0 + 90) / 4)
    # numpy linear: rank 0.999 * (4 - 1) = 2.997 between sorted[2] and sorted[3]
    assert m["p999_jct_s"] == pytest.approx(100 + 0.997 * (490 - 100))
    assert m["p999_queue_s"] == pytest.approx(40 + 0.997 * (90 - 40))
    assert m["p999_queue_h"] == pytest.approx(m["p999_queue_s"] / 3600)
    assert m["makespan_s"] == 520.0 and m["makespan_h"] == pytest.approx(520 / 3600)
    assert m["finished_in_profiling"] == 1 and m["finished_in_profiling_pct"] == 25.0
    assert m["short_jobs"] == 2  # b (30 s) and c (50 s)
    assert m["short_jobs_queued"] == 1 and m["short_jobs_queued_pct"] == 50.0  # b waited 40 s
    assert m["shared_jobs"] == 1 and m["preemptions"] == 2


def test_utilization_is_time_weighted_over_the_makespan():
    busy_gpu_seconds = 1 * 10 + 2 * 40 + 4 * 20 + 3 * 10 + 1 * 20 + 0 * 20 + 4 * 400
    m = compute_metrics(OUTCOMES, TIMELINE, total_gpus=8)
    assert m["gpu_utilization"] == pytest.approx(busy_gpu_seconds / (8 * 520))
    # the window clips change points, the last value holds to the end, nothing is busy before the first
    assert time_weighted_utilization([(10.0, 2)], 4, 0.0, 20.0) == pytest.approx(2 * 10 / (4 * 20))
    assert time_weighted_utilization([(0.0, 4), (5.0, 2)], 4, 2.0, 10.0) == pytest.approx((4 * 3 + 2 * 5) / 32)
    assert time_weighted_utilization([(0.0, 9)], 4, 0.0, 10.0) == 1.0  # clipped at the cluster size
    assert time_weighted_utilization([], 4, 0.0, 10.0) == 0.0


def test_utilization_over_time_bins_the_step_function():
    series = utilization_over_time(TIMELINE, 8, 0.0, 520.0, bin_s=100.0)
    assert list(series.index) == [0.0, 100.0, 200.0, 300.0, 400.0, 500.0]
    assert series.iloc[0] == pytest.approx((10 + 80 + 80 + 30 + 20) / 800)
    assert series.iloc[1] == pytest.approx(4 * 80 / 800)
    assert series.iloc[5] == pytest.approx(0.5)  # the 20 s tail bin, 4 of 8 GPUs busy
    assert list(utilization_over_time([(10.0, 2)], 4, 0.0, 20.0, bin_s=5.0)) == [0.0, 0.0, 0.5, 0.5]
    with pytest.raises(ValueError):
        utilization_over_time(TIMELINE, 8, 0.0, 10.0, bin_s=0)


def test_tail_matches_the_documented_percentile_method():
    values = list(range(1001))  # rank 0.999 * 1000 = 999 exactly
    assert tail(values) == pytest.approx(999.0)
    assert tail([5.0]) == 5.0 and tail([]) == 0.0
    assert tail([0.0, 10.0]) == pytest.approx(9.99)


def test_per_vc_table_groups_jobs():
    table = per_vc_table(OUTCOMES)
    assert list(table.index) == ["v1", "v2"]
    assert table.loc["v1", "jobs"] == 2 and table.loc["v2", "avg_gpus"] == 2.5
    assert table.loc["v1", "avg_jct_h"] == pytest.approx(85 / 3600)
    assert table.loc["v2", "avg_queue_h"] == pytest.approx(45 / 3600)
    assert table.loc["v2", "p999_queue_h"] == pytest.approx((0 + 0.999 * 90) / 3600)
    assert table.loc["v1", "shared_jobs"] == 1 and table.loc["v2", "shared_jobs"] == 0


def test_empty_runs_are_refused():
    with pytest.raises(ValueError, match="no job outcomes"):
        compute_metrics([], [], 8)
    with pytest.raises(ValueError, match="no job outcomes"):
        per_vc_table([])
