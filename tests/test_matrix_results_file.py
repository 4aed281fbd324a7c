"""The policy matrix's --json file says which run made it: a seeded or overridden run is never resumed as the
default one (whose figures the issue-35 check and the variant bench read)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_policy_matrix as matrix

FIGURES = {("2017-10-02..2017-10-09", 54, "lucid"): {"avg_jct_h": 3.9}}


def test_a_seeded_run_is_reused_by_the_same_seed_only(tmp_path):
    path = str(tmp_path / "m.json")
    seeded = matrix.run_label({}, {}, 1)
    matrix.save_results(path, FIGURES, seeded)
    assert matrix.load_results(path, seeded) == FIGURES
    assert matrix.load_results(path) == {}  # the default run does not resume from seed 1's figures
    assert matrix.load_results(path, matrix.run_label({"orchestrator.guard_slowdown": "8"}, {}, 1)) == {}


def test_the_default_run_keeps_the_plain_format(tmp_path):
    path = tmp_path / "m.json"
    matrix.save_results(str(path), FIGURES)
    assert matrix.RUN_KEY not in path.read_text()
    assert matrix.load_results(str(path)) == FIGURES
    assert matrix.load_results(str(path), matrix.run_label({}, {"binder.pair_priority_ratio": "4"}, 0)) == {}


def test_the_holdout_subset_shares_no_size_and_no_window_start_with_the_matrix(capsys):
    """The held-out check is one the defaults were never tuned on: other sizes, 10-day windows from Wednesdays
    (the Nov 1 one overlaps the matrix's Nov 1-14, at other sizes)."""
    from datetime import date

    import pytest

    assert not set(matrix.HOLDOUT_SIZES) & set(matrix.SIZES)
    for start, end in matrix.HOLDOUT_WINDOWS:
        first, last = date.fromisoformat(start), date.fromisoformat(end)
        assert (start, end) not in matrix.all_windows() and first.weekday() == 2 and (last - first).days == 10
    with pytest.raises(SystemExit):
        matrix.main(["--holdout", "--quick"])
    assert "choose one" in capsys.readouterr().err
