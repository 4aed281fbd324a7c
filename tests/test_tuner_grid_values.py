"""`lucid tune`'s grid: each value of each grid flag is checked on its own and a bad one fails naming the flag
and the value (never silently left out, never blamed on the thresholds); only combinations whose knobs
conflict (a Medium threshold above the Tiny one) are left out, and the report says how many."""

from __future__ import annotations

import json

import pytest

from lucid_core.cli import main
from lucid_core.config import ConfigError, LucidConfig

TRACE = "job_id,submit_time,duration,gpus,vc,user,name,state\n" + "".join(
    f"j{i},2024-03-04 00:{i:02d}:00,{600 + 60 * i},{1 + i % 4},nlp,u{i % 3},job{i},COMPLETED\n" for i in range(12))


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def trace(tmp_path, monkeypatch):
    monkeypatch.setenv("LUCID_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("LUCID_CONFIG", raising=False)
    path = tmp_path / "trace.csv"
    path.write_text(TRACE, encoding="utf-8")
    return path


@pytest.mark.parametrize(("flags", "line"), [
    (["--tprof", "100,-5"], "--tprof: expected a number (float) from 1 to 86400, got '-5'"),
    (["--tprof", "nan"], "--tprof: expected a number (float) from 1 to 86400, got 'nan'"),
    (["--tprof", "inf"], "--tprof: expected a number (float) from 1 to 86400, got 'inf'"),
    (["--tprof", "100,abc"], "--tprof: expected a number (float) from 1 to 86400, got 'abc'"),
    (["--cprof", "1e9"], "--cprof: expected a whole number (int) from 0 to 10000, got '1e9'"),
    (["--nprof", "2.5"], "--nprof: expected a whole number (int) from 0 to 1024, got '2.5'"),
    (["--tiny", "0.9,2"], "--tiny: expected a number (float) from 0 to 1, got '2'"),
    (["--tiny", "2"], "--tiny: expected a number (float) from 0 to 1, got '2'"),
    (["--sharing", "on,maybe"], "--sharing: expected one of auto, on, off, got 'maybe'"),
    (["--sharing", "maybe"], "--sharing: expected one of auto, on, off, got 'maybe'"),
    (["--cadence", "hourly"], "--cadence: expected one of never, daily, weekly, got 'hourly'"),
    (["--aging", "-1"], "--aging: expected a number (float) >= 0, got '-1'"),
    (["--around", "tprof_s,bogus"], "--around: unknown tuner knob 'bogus'"),
])
def test_a_bad_grid_value_fails_naming_its_flag_before_anything_runs(flags, line, trace, tmp_path, capsys):
    out = tmp_path / "report"
    code, stdout, err = _run(["tune", "--trace", str(trace), "--out", str(out), *flags], capsys)
    lines = [x for x in err.splitlines() if x.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, (code, err)
    assert lines[0].startswith(f"lucid tune: error: {line}"), lines[0]
    assert not out.exists() and stdout == "", "the sweep ran although a grid value was bad"


def test_a_grid_with_only_conflicting_combinations_says_which_knobs_conflict(trace, tmp_path, capsys):
    code, _, err = _run(["tune", "--trace", str(trace), "--out", str(tmp_path / "r"), "--tiny", "0.9",
                         "--medium", "0.92", "--around", ""], capsys)
    assert code == 2 and err.strip() == (
        "lucid tune: error: the grid has no valid configuration: knobs conflict in its only combination "
        "(e.g. binder.medium_threshold (0.92) must not exceed binder.tiny_threshold (0.9))"), err


def test_the_cli_and_report_count_the_conflicting_combinations_left_out(trace, tmp_path, capsys):
    out = tmp_path / "r"
    code, stdout, err = _run(["tune", "--trace", str(trace), "--out", str(out), "--tiny", "0.9,0.95",
                              "--medium", "0.85,0.92", "--around", ""], capsys)
    assert code == 0, err
    said = ("1 of the 4 combinations of the grid was left out because their knobs conflict "
            "(e.g. binder.medium_threshold (0.92) must not exceed binder.tiny_threshold (0.9))")
    assert f"note: {said}" in stdout
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    # (0.95, 0.85) is the current configuration, replayed on its own; (0.9, 0.92) conflicts
    assert report["dropped"] == 1 and report["configurations"] == 2
    assert f"{said}." in (out / "report.md").read_text(encoding="utf-8")
    assert said in (out / "report.html").read_text(encoding="utf-8")


def test_grid_expansion_refuses_a_bad_value_and_counts_only_conflicts():
    from lucid_core.tuner import grid_expansion

    with pytest.raises(ConfigError, match=r"^tprof_s: expected a number \(float\) from 1 to 86400, got -5$"):
        grid_expansion({"tprof_s": [100, -5]})
    grid = grid_expansion({"tprof_s": [100, 100.0], "tiny_threshold": [0.9, 0.95], "medium_threshold": [0.85, 0.92]})
    assert grid.dropped == 1 and grid.combinations == 4 and len(grid.configs) == 3
    assert all(isinstance(c["profiler.tprof_s"], float) for c in grid.configs)


def test_sweep_grid_keeps_the_count_after_leaving_the_current_configuration_out():
    from lucid_core.tuner import sweep_grid

    grid = sweep_grid({"tiny_threshold": [0.9, 0.95], "medium_threshold": [0.85, 0.92]}, [], LucidConfig())
    # (0.95, 0.85) is the current one, replayed on its own; (0.9, 0.92) conflicts
    assert grid.dropped == 1 and grid.combinations == 4 and len(grid.configs) == 2


def test_the_cli_and_the_dag_refuse_an_empty_grid_with_one_message():
    """The Airflow tuner's expand_grid task and `lucid tune` share `sweep_grid_with_configurations`: the DAG had
    its own stale hint blaming the thresholds whatever the cause."""
    from lucid_core.tuner import sweep_grid_with_configurations

    with pytest.raises(ValueError, match=r"knobs conflict in its only combination \(e\.g\. binder\.medium"):
        sweep_grid_with_configurations({"tiny_threshold": [0.9], "medium_threshold": [0.92]}, [], LucidConfig())
    grid = sweep_grid_with_configurations({"tprof_s": [100, 300]}, [], LucidConfig())
    assert [c["profiler.tprof_s"] for c in grid.configs] == [100, 300] and grid.dropped == 0


def test_max_configurations_counts_what_the_report_counts_and_a_grid_that_sweeps_nothing_is_refused():
    """The default sweep (Tprof and sharing, three values each) is the current configuration and 8 others, and the
    report says 8 configurations; max_configurations=8 refused it as 9 combinations. `around: []` with no knob's
    values replayed the current configuration as its own candidate and said the knobs made no difference."""
    from lucid_core.tuner import GRID_KNOBS, sweep_grid_with_configurations

    none = {name: None for name in GRID_KNOBS}
    grid = sweep_grid_with_configurations(none, ["tprof_s", "sharing"], LucidConfig(), most=8)
    assert len(grid.configs) == 8
    with pytest.raises(ValueError, match="the grid has 9 combinations, more than max_configurations=7"):
        sweep_grid_with_configurations(none, ["tprof_s", "sharing"], LucidConfig(), most=7)
    with pytest.raises(ValueError, match="the grid sweeps no knob"):
        sweep_grid_with_configurations(none, [], LucidConfig())
