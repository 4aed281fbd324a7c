"""Reports: the side-by-side table (every policy, correct ratios, named baseline), plots, result files."""

from __future__ import annotations

import csv
import json

import pytest

from lucid_core.sim.metrics import compute_metrics
from lucid_core.sim.records import JobOutcome
from lucid_core.sim.report import (
    CDF_MAX_POINTS,
    PlotWorker,
    cdf_points,
    jct_cdf_plot,
    pick_baseline,
    queue_per_vc_plot,
    ratio_text,
    side_by_side,
    utilization_plot,
    write_results,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def metrics(avg_jct_h: float, p999_queue_h: float) -> dict[str, float]:
    return {"jobs": 10, "avg_jct_h": avg_jct_h, "p999_jct_h": 2 * avg_jct_h, "avg_queue_h": 0.5,
            "p999_queue_h": p999_queue_h, "makespan_h": 30.0, "gpu_utilization": 0.625,
            "finished_in_profiling": 3, "short_jobs_queued": 1, "shared_jobs": 4}


RESULTS = {"fifo": metrics(4.84, 9.0), "sjf": metrics(2.42, 6.0), "tiresias": metrics(2.24, 7.42),
           "lucid": metrics(2.25, 2.79)}


def row_of(table: str, policy: str) -> list[str]:
    return next(line.split() for line in table.splitlines() if line.split()[:1] == [policy])


def test_table_lists_every_policy_with_ratios_against_lucid():
    table = side_by_side(RESULTS)
    header = table.splitlines()[0]
    assert "x lucid" in header and "avg JCT h" in header and "P99.9 queue h" in header
    for policy in RESULTS:
        assert row_of(table, policy)[0] == policy
    fifo = row_of(table, "fifo")
    assert fifo[1:3] == ["4.84", "2.15x"]  # 4.84 / 2.25
    assert "3.23x" in fifo  # P99.9 queue 9.0 / 2.79
    assert row_of(table, "sjf")[1:3] == ["2.42", "1.08x"]
    assert "2.66x" in row_of(table, "tiresias")  # P99.9 queue 7.42 / 2.79
    lucid = row_of(table, "lucid")
    assert lucid[2] == "1.00x" and "62.5" in lucid
    assert "policy value / lucid value" in table


def test_baseline_falls_back_to_the_first_policy_and_is_named():
    table = side_by_side({"fifo": metrics(4.0, 8.0), "sjf": metrics(2.0, 2.0)})
    assert "x fifo" in table.splitlines()[0]
    assert row_of(table, "sjf")[1:3] == ["2.00", "0.50x"]
    assert pick_baseline(["FIFO", "Lucid"]) == "Lucid"
    with pytest.raises(ValueError):
        side_by_side({})


def test_ratio_text_handles_zero_baselines():
    assert ratio_text(3.0, 1.5) == "2.00x"
    assert ratio_text(0.0, 0.0) == "1.00x"
    assert ratio_text(1.0, 0.0) == "n/a"


OUTCOMES = [
    JobOutcome("a", "v1", 1, 0.0, 100.0, 0.0, 100.0, 0.0),
    JobOutcome("b", "v2", 2, 10.0, 30.0, 50.0, 80.0, 40.0, shared_seconds=5.0),
]


def test_plots_are_png_files(tmp_path):
    by_policy = {"fifo": OUTCOMES, "lucid": OUTCOMES[:1]}
    cdf = jct_cdf_plot(by_policy, tmp_path / "plots" / "jct_cdf.png")
    bars = queue_per_vc_plot(by_policy, tmp_path / "queue_vc.png")
    util = utilization_plot({"fifo": ([(0.0, 1), (50.0, 3), (80.0, 0)], 4), "lucid": ([], 4)},
                            tmp_path / "util.png", bin_s=10.0)
    for path in (cdf, bars, util):
        assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 5000


def test_a_cdf_keeps_every_point_up_to_its_limit_then_evenly_spaced_ranks_with_both_ends():
    assert list(cdf_points(5)) == [0, 1, 2, 3, 4]
    kept = cdf_points(10650)
    assert len(kept) <= CDF_MAX_POINTS and kept[0] == 0 and kept[-1] == 10649
    assert (kept[1:] > kept[:-1]).all()  # increasing ranks, none twice
    gaps = kept[1:] - kept[:-1]
    assert gaps.max() - gaps.min() <= 1  # evenly spaced: no part of the CDF drawn coarser than another


def test_the_plot_worker_draws_the_three_plots_in_its_helpers(tmp_path):
    many = [JobOutcome(f"j{k}", f"v{k % 3}", 1, float(k), float(k + 10 + k % 97), float(k), float(k + 10 + k % 97),
                       0.0) for k in range(5000)]
    with PlotWorker() as plots:
        drawn = plots.draw({"fifo": many, "lucid": OUTCOMES}, {"fifo": ([(0.0, 1), (50.0, 3), (80.0, 0)], 4)},
                           tmp_path / "run").result()
    assert [p.name for p in drawn] == ["jct_cdf.png", "queue_per_vc.png", "gpu_utilization.png"]
    for path in drawn:
        assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 5000


def test_results_are_written_as_csv_and_json(tmp_path):
    m = compute_metrics(OUTCOMES, [(0.0, 1), (50.0, 3), (80.0, 1), (100.0, 0)], 4)
    paths = write_results(tmp_path / "out", {"fifo": OUTCOMES}, {"fifo": m}, {"trace": "tiny.csv", "nodes": 1})
    names = sorted(p.name for p in paths)
    assert names == ["fifo_jobs.csv", "fifo_per_vc.csv", "metrics.json"]
    with open(tmp_path / "out" / "fifo_jobs.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [r["job_id"] for r in rows] == ["a", "b"]
    assert float(rows[1]["jct"]) == 70.0 and float(rows[1]["queue_delay"]) == 40.0
    payload = json.loads((tmp_path / "out" / "metrics.json").read_text())
    assert payload["run"] == {"trace": "tiny.csv", "nodes": 1}
    assert payload["metrics"]["fifo"]["avg_jct_s"] == pytest.approx(85.0)
