"""The tuner report reads like a decision (issue 38, item 4): the current configuration is always a row,
the verdict follows from the rows and the noise band, the grid is built around the current values and
never repeats one value, durations have one unit, utilization is in percent, no raw dict is printed,
and one press of Trigger is one DAG run."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from lucid_af_support import REPO

METRICS = {"avg_jct_s": 6000.0, "avg_queue_delay_s": 900.0, "p999_queue_delay_s": 5400.0, "gpu_utilization": 0.523,
           "ended_in_profiling": 2.0, "jobs_shared": 1.0, "jobs": 40.0}


def _result(index: int, overrides: dict, jct: float, role: str = "candidate", seed: int = 0, util: float = 0.523):
    from lucid_core.tuner import ConfigResult

    return ConfigResult(index, overrides, METRICS | {"avg_jct_s": jct, "gpu_utilization": util}, role=role, seed=seed)


def _current_runs(first: int, jcts=(6000.0, 6060.0, 5970.0)) -> list:
    """The current configuration under three workload draws: a noise band of 90 s around 6000 s."""
    return [_result(first + k, {}, jct, role="current", seed=k) for k, jct in enumerate(jcts)]


def _rows(directory: Path) -> tuple[list[str], list[list[str]]]:
    lines = (directory / "report.md").read_text().splitlines()
    table = [line for line in lines if line.startswith("| ")]
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in table]
    return cells[0], cells[1:]


# --- the grid ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("form_name", ["tprof_s", "nprof_gpus", "cprof_nodes", "tiny_threshold", "medium_threshold",
                                       "pair_priority_ratio", "aging", "guard_slowdown", "backfill_margin",
                                       "long_quantile",
                                       "guard_tail", "yield_margin",
                                       "yield_max"])
def test_a_grid_around_the_current_value_never_repeats_one_value(form_name):
    from lucid_core.tuner_grid import GRID_KNOBS, knob_range, knob_text, values_around

    knob = knob_range(GRID_KNOBS[form_name])
    lo, hi = knob.lo or 0, knob.hi if knob.hi is not None else float("inf")
    currents = {lo, 0, 1, 2, 7, 1e-9, 0.001, 0.05, 0.5, 0.95, 200, 86400, 1e6} | ({hi} if knob.hi else set())
    for current in sorted(knob.clip(c) for c in currents):
        current = int(current) if knob.kind is int else float(current)
        values = values_around(current, knob)
        texts = [knob_text(v) for v in values]
        assert len(set(texts)) == len(texts) >= 2, (form_name, current, values)
        assert knob_text(current) in texts, (form_name, current, values)
        assert values == sorted(values) and all(lo <= v <= hi for v in values), (form_name, current, values)


def test_the_sweep_is_built_around_the_live_values_and_leaves_the_current_one_to_its_own_row():
    from lucid_core.config import LucidConfig
    from lucid_core.tuner import sweep_configurations

    live = LucidConfig().with_overrides({"orchestrator.aging": 0.0, "profiler.tprof_s": 600.0})
    configs = sweep_configurations({"tprof_s": None, "aging": [], "sharing": None}, ["aging", "tprof_s"], live)
    assert sorted({c["orchestrator.aging"] for c in configs}) == [0.0, 16.0, 32.0]  # 0 steps up, never [0, 0, 0]
    assert sorted({c["profiler.tprof_s"] for c in configs}) == [300.0, 600.0, 1200.0]
    assert len(configs) == 3 * 3 - 1 and {"orchestrator.aging": 0.0, "profiler.tprof_s": 600.0} not in configs
    assert all(set(c) == {"orchestrator.aging", "profiler.tprof_s"} for c in configs)  # the rest stays as it is
    # explicit values win over "around"; an explicit grid of only the current values still runs once
    only = sweep_configurations({"tprof_s": [600]}, ["tprof_s"], live)
    assert only == [{"profiler.tprof_s": 600}]


# --- the verdict ------------------------------------------------------------------------------------------


def test_every_row_worse_beyond_the_noise_says_so_and_keeps_the_current(tmp_path):
    from lucid_core.tuner import TunerSettings, write_report

    # the observed failure: a small history where the grid's rows were all +188% worse
    results = [_result(0, {"orchestrator.aging": 16.0}, 17300.0), _result(1, {"orchestrator.aging": 32.0}, 17250.0),
               *_current_runs(2)]
    summary = write_report(results, TunerSettings(main_nodes=2), tmp_path)
    assert summary["keep_current"] is True
    assert summary["counts"] == {"better": 0, "within noise": 0, "same": 0, "worse": 2}
    assert "all 2 configurations of the grid are worse than it by more than the run-to-run noise" in summary["verdict"]
    assert "no configuration differs" not in summary["verdict"]
    header, rows = _rows(tmp_path)
    vs = header.index(next(h for h in header if h.startswith("avg_jct vs current")))
    assert [r[1] for r in rows] == ["current", "#1", "#0"]
    assert all(r[vs].endswith("worse") and "+188" in r[vs] for r in rows[1:]), rows


def test_a_row_beyond_the_noise_is_recommended(tmp_path):
    from lucid_core.tuner import TunerSettings, chosen_overrides, write_report

    results = [_result(0, {"profiler.tprof_s": 100.0}, 5000.0), _result(1, {"profiler.tprof_s": 400.0}, 6030.0),
               *_current_runs(2)]
    summary = write_report(results, TunerSettings(main_nodes=2), tmp_path)
    assert summary["keep_current"] is False and summary["best"]["index"] == 0
    assert summary["counts"]["better"] == 1 and summary["counts"]["within noise"] == 1
    assert summary["verdict"].startswith("Configuration #0 improves avg_jct by 16.7 min over the current")
    assert chosen_overrides(summary) == {"profiler.tprof_s": 100.0}
    header, rows = _rows(tmp_path)
    vs = next(i for i, h in enumerate(header) if h.startswith("avg_jct vs current"))
    assert rows[1][1] == "#0" and rows[1][vs].endswith("better") and rows[2][vs].endswith("within noise")
    assert "Best: configuration #0: tprof_s 100 (now 200)" in (tmp_path / "report.md").read_text()


def test_rows_within_or_worse_never_become_a_recommendation():
    from lucid_core.tuner import assess, rank

    ranked = rank([_result(0, {"x.y": 1}, 6050.0), _result(1, {"x.y": 2}, 9000.0)], "avg_jct")
    verdict = assess(ranked, _current_runs(2), "avg_jct")
    assert verdict["keep_current"] is True and verdict["counts"]["worse"] == 1
    assert "none of the 2 configurations beats it" in verdict["text"] and "1 is worse beyond it" in verdict["text"]


def test_the_current_configuration_is_always_a_row(tmp_path):
    from lucid_core.tuner import ConfigResult, TunerSettings, write_report

    settings = TunerSettings(main_nodes=2)
    cases = {"replayed": _current_runs(1),
             "failed": [ConfigResult(1, {}, error="ValueError: boom", role="current")],
             "absent": []}
    for name, current in cases.items():
        write_report([_result(0, {"profiler.tprof_s": 100.0}, 5000.0), *current], settings, tmp_path / name)
        _, rows = _rows(tmp_path / name)
        assert rows[0][:2] == ["-", "current"], (name, rows)
        assert len(rows) == 2 and rows[1][1] == "#0"
        html = (tmp_path / name / "report.html").read_text()
        assert "<tr class='current'><td>-</td><td>current</td>" in html


# --- units and text ---------------------------------------------------------------------------------------


def test_one_duration_unit_across_the_table_and_the_plots_and_utilization_in_percent(tmp_path, monkeypatch):
    import matplotlib.figure

    from lucid_core.tuner import TunerSettings, write_report

    drawn: list[dict] = []
    save = matplotlib.figure.Figure.savefig

    def record(fig, *args, **kwargs):
        for ax in fig.axes:
            drawn.append({"x": ax.get_xlabel(), "y": ax.get_ylabel(),
                          "bars": [p.get_height() for p in ax.patches if hasattr(p, "get_height")
                                   and type(p).__name__ == "Rectangle"]})
        return save(fig, *args, **kwargs)

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", record)
    results = [_result(0, {"profiler.tprof_s": 100.0}, 5000.0, util=0.61),
               _result(1, {"profiler.tprof_s": 400.0}, 7000.0, util=0.4), *_current_runs(2)]
    summary = write_report(results, TunerSettings(main_nodes=2), tmp_path)
    assert summary["duration_unit"] == "min"
    header, rows = _rows(tmp_path)
    units = {m.group(1) for h in header for m in [re.search(r"\((s|min|h)\)$", h)] if m}
    assert units == {"min"}, header
    labels = [d["x"] for d in drawn] + [d["y"] for d in drawn]
    assert {m.group(1) for label in labels for m in [re.search(r"\((s|min|h)\)", label)] if m} == {"min"}, labels
    jct = header.index("avg JCT (min)")
    assert [r[jct] for r in rows] == ["100", "83.3", "117"]
    bars = next(d["bars"] for d in drawn if d["y"].startswith("avg_jct"))
    assert bars[:2] == pytest.approx([5000 / 60, 7000 / 60])  # the plot in the table's unit
    util = header.index("GPU util (%)")
    assert [r[util] for r in rows] == ["52.3", "61.0", "40.0"]
    assert not any(re.fullmatch(r"0\.\d+", r[util]) for r in rows)


def test_a_utilization_verdict_speaks_in_percent(tmp_path):
    from lucid_core.tuner import TunerSettings, write_report

    results = [_result(0, {"profiler.tprof_s": 100.0}, 6000.0, util=0.70),
               *[_result(1 + k, {}, 6000.0, role="current", seed=k, util=u) for k, u in enumerate((0.52, 0.53, 0.52))]]
    summary = write_report(results, TunerSettings(main_nodes=2, objective="utilization"), tmp_path)
    assert summary["keep_current"] is False
    assert "improves utilization by 18.0 percentage points" in summary["verdict"]
    assert "(52.0% -> 70.0%)" in summary["verdict"]


def test_report_and_progress_text_hold_no_raw_dict(tmp_path, capsys):
    import argparse

    from lucid_af_support import SAMPLE_TRACE

    from lucid_core import tuner

    parser = argparse.ArgumentParser()
    tuner.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["tune", "--trace", str(SAMPLE_TRACE), "--nodes", "2", "--tprof", "100,300",
                              "--aging", "0,16", "--around", "", "--out", str(tmp_path / "r")])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "[1/7] #0 aging 0, tprof_s 100: avg JCT" in out and "current configuration, draw 0" in out
    texts = [out] + [(tmp_path / "r" / name).read_text() for name in ("report.md", "report.html", "table.csv")]
    for text in texts:
        assert "{'" not in text and '{"' not in text and "{&#x27;" not in text, text[:400]
    header = (tmp_path / "r" / "table.csv").read_text().splitlines()[0]
    assert "worker" not in header  # no worker ran the CLI's sweep: no empty column


def test_the_tuner_listing_names_the_proposal_in_words(tmp_path):
    from fastapi.testclient import TestClient
    from lucid_airflow.web import create_lucid_app

    from lucid_core.tuner import TunerSettings, write_report

    reports = tmp_path / "reports"
    results = [_result(0, {"profiler.tprof_s": 100.0}, 5000.0), *_current_runs(1)]
    write_report(results, TunerSettings(main_nodes=2), reports / "tuner" / "run_a")
    client = TestClient(create_lucid_app(lambda: f"sqlite:///{tmp_path / 'x.db'}", lambda: reports, protect=False))
    listing = client.get("/tuner")
    assert listing.status_code == 200 and "#0: tprof_s 100 (now 200)" in listing.text
    assert "{&quot;" not in listing.text and "{'" not in listing.text
    page = client.get("/tuner/run_a")
    assert page.status_code == 200 and "{'" not in page.text and "Configuration #0 improves" in page.text


# --- the DAG ----------------------------------------------------------------------------------------------


def _tuner_dag():
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags" / "lucid_system_tuner.py"))
    assert not bag.import_errors, bag.import_errors
    return bag.dags["lucid_system_tuner"]


def test_one_press_of_trigger_is_one_run_the_schedule_never_fires_on_unpause():
    """The scheduler's own computation of the first automated run (no run yet, as on a fresh Airflow):
    it must lie in the future, so unpausing creates no run beside the one Trigger asks for."""
    from airflow.serialization.serialized_objects import DagSerialization

    dag = _tuner_dag()
    assert dag.catchup is False and dag.max_active_runs == 1 and dag.start_date is None
    assert dag.timetable.run_immediately == timedelta(0)
    scheduler_dag = DagSerialization.from_dict(DagSerialization.to_dict(dag))
    first = scheduler_dag.next_dagrun_info(last_automated_run_info=None)
    assert first is not None, "the tuner still runs weekly"
    assert first.run_after > datetime.now(UTC), f"unpausing would start a run for {first.run_after}"
    assert first.run_after - datetime.now(UTC) <= timedelta(days=7)


def test_the_forms_defaults_sweep_around_the_current_values():
    from lucid_core.config import LucidConfig
    from lucid_core.tuner import GRID_KNOBS, sweep_configurations

    dag = _tuner_dag()
    assert dag.params.get_param("around").schema["items"]["enum"] == list(GRID_KNOBS)
    defaults = {name: dag.params[name] for name in GRID_KNOBS}
    assert all(value is None for value in defaults.values()), defaults  # empty: the live value, not a fixed one
    configs = sweep_configurations(defaults, dag.params["around"], LucidConfig())
    assert sorted({c["profiler.tprof_s"] for c in configs}) == [100.0, 200.0, 400.0]
    assert sorted({c["binder.sharing"] for c in configs}) == ["auto", "off", "on"]
    assert len(configs) == 8
