"""The drift alert waits for `drift_checks_in_a_row` drifted checks of a model in a row, counted from the drift
history the Update Engine keeps: on Philly's daily checks a one-day rise of the duration model's error passed the
error threshold on 15 of 52 days with nothing changed (`benchmarks/bench_drift_noise.py --errors`)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from lucid_core.alerts import alert_message
from lucid_core.update import drift_reports, drifted_checks_before, save_drift_history

REFERENCE = [0.5] * 40


def decision(recent_error: float, version: int = 3) -> dict:
    """An evaluation whose promoted duration model errs `recent_error` on the recent jobs (0.5 when trained)."""
    entry = {"promoted_version": version, "promoted_recent_errors": [recent_error] * 40,
             "promoted_reference_errors": REFERENCE, "promoted_reference_inputs": {"gpus": [1.0] * 40},
             "recent_inputs": {"gpus": [1.0] * 40}}
    return {"evaluation": {"models": {"duration": entry}}, "decisions": {}}


def check(root: Path, run_id: str, recent_error: float, checks_to_alert: int = 2, version: int = 3) -> dict:
    """One Update Engine check as the DAG runs it: count from the history, report, keep the report."""
    made = decision(recent_error, version)
    before = drifted_checks_before(root, run_id)
    (report,) = drift_reports(made, 1.25, 0.2, drifted_before=before, checks_to_alert=checks_to_alert)
    save_drift_history(root, run_id, [report])
    return report


def test_one_drifted_check_waits_and_the_second_in_a_row_alerts(tmp_path):
    first = check(tmp_path, "run1", 1.0)
    assert first["drifted"] and not first["alert"] and first["in_a_row"] == 1
    assert "drift, 1 of 2 checks in a row" in first["subject"] and alert_message([first]) is None
    second = check(tmp_path, "run2", 1.0)
    assert second["alert"] and second["in_a_row"] == 2 and "DRIFT" in second["subject"]
    assert "Checks in a row that drifted: 2" in second["body"] and alert_message([second]) is not None


def test_a_check_that_did_not_drift_starts_the_count_over(tmp_path):
    for run, error in (("run1", 1.0), ("run2", 0.5), ("run3", 1.0)):
        report = check(tmp_path, run, error)
    assert report["drifted"] and not report["alert"] and report["in_a_row"] == 1


def test_at_one_check_the_first_drift_alerts_and_a_calm_check_never_does(tmp_path):
    assert check(tmp_path, "run1", 1.0, checks_to_alert=1)["alert"]
    calm = check(tmp_path, "run2", 0.5, checks_to_alert=1)
    assert not calm["drifted"] and not calm["alert"] and calm["in_a_row"] == 0


def test_the_count_passes_over_runs_that_did_not_check_the_model_and_stops_at_an_unreadable_record(tmp_path):
    check(tmp_path, "run1", 1.0)
    save_drift_history(tmp_path, "run2", [])  # no promoted model checked that run
    assert drifted_checks_before(tmp_path) == {"duration": 1}
    broken = sorted(tmp_path.glob("*.json"))[-1].with_name("99999999T999999-broken.json")  # newest by name
    broken.write_text('{"reports": [{"model": "duration", "drif')  # cut short
    assert drifted_checks_before(tmp_path) == {}  # nothing known to follow on from it
    broken.write_text(json.dumps({"reports": [{"model": "duration", "drifted": "yes"}]}))  # not our shape
    assert drifted_checks_before(tmp_path) == {}


def test_a_retried_check_does_not_count_its_own_earlier_record(tmp_path):
    """The check task kept its record and then failed; its retry reads the history again."""
    check(tmp_path, "run1", 1.0)
    kept = check(tmp_path, "run2", 1.0)
    assert kept["alert"]
    assert drifted_checks_before(tmp_path, "run2") == {"duration": 1}


def test_a_check_kept_twice_by_one_run_counts_once(tmp_path):
    """run1's check ran again (cleared by hand, or retried after it kept its record): two records of run1."""
    import time

    check(tmp_path, "run1", 1.0, 3)
    time.sleep(1.1)  # history files are named by the second
    check(tmp_path, "run1", 1.0, 3)
    time.sleep(1.1)
    third = check(tmp_path, "run2", 1.0, 3)
    assert third["in_a_row"] == 2 and not third["alert"]


def test_drift_that_retraining_did_not_cure_alerts_across_versions(tmp_path):
    """The Update Engine promotes a retrained version at (nearly) every run, so each version is checked once: counted
    per version, v3 drifted, v4 drifted, v5 drifted never made two in a row and the default alert never went out.
    The kind's served model drifted in each: the second check alerts; a check that did not drift starts over."""
    first = check(tmp_path, "run1", 1.0, version=3)
    assert first["in_a_row"] == 1 and not first["alert"]
    second = check(tmp_path, "run2", 1.0, version=4)
    assert second["in_a_row"] == 2 and second["alert"]
    time.sleep(1.1)
    assert not check(tmp_path, "run3", 0.1, version=5)["drifted"]
    time.sleep(1.1)
    assert check(tmp_path, "run4", 1.0, version=6)["in_a_row"] == 1


def test_a_history_record_nested_past_the_parser_ends_the_count_and_fails_nothing(tmp_path):
    check(tmp_path, "run1", 1.0)
    deep = sorted(tmp_path.glob("*.json"))[-1].with_name("99999999T999999-deep.json")
    deep.write_text('{"reports": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert drifted_checks_before(tmp_path) == {}
