"""The demo's store, seeded as scripts/demo.py seeds it, drives the Update Engine's steps (the functions the
lucid_update_engine DAG calls) to a promoted model, then a drift check on the demo's own jobs whose alert
reaches the demo's SMTP sink (aiosmtpd on loopback) through Airflow's SMTP notifier, as the DAG sends it."""

from __future__ import annotations

import importlib.util
import json
import mailbox
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def load_demo() -> ModuleType:
    """scripts/demo.py as a module (scripts/ is no package)."""
    if "lucid_demo_script" in sys.modules:
        return sys.modules["lucid_demo_script"]
    spec = importlib.util.spec_from_file_location("lucid_demo_script", REPO / "scripts" / "demo.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _finish_demo_jobs(demo: ModuleType, url: str, start: float) -> list[str]:
    """The demo's job plan submitted and ended as the demo's hosts end them: seconds long (the sleep of its
    command plus the 6 s profiling window), FAILED when the command fails, profiled (emulated) with the
    profile its script had in the seeded history (the same user's same job name)."""
    from lucid_core.runtime.store.schema import JobRow
    from lucid_core.runtime.store.store import Store
    from lucid_core.runtime.surfaces.submission import JobRequest, submit

    store = Store(url)
    ids = []
    try:
        for delay, gpus, user, vc, name, command in demo._sample_jobs(18, seed=7):
            job_id = submit(store, JobRequest(command, gpus=gpus, user=user, vc=vc, name=name))
            seconds = float(command.split()[1].rstrip(";"))
            with store.session() as s:
                job = s.get(JobRow, job_id)
                seeded = s.query(JobRow).filter(JobRow.job_id.startswith(demo.SEEDED_PREFIX), JobRow.user == user,
                                                JobRow.name == name).first()
                job.submit_time = start + delay
                job.start_time = job.submit_time + 3.0
                job.end_time = job.start_time + 6.0 + seconds
                job.state = "FAILED" if "exit 1" in command else "COMPLETED"
                job.exit_code = 1 if job.state == "FAILED" else 0
                job.profiled, job.profile_emulated = True, True
                job.gpu_util, job.mem_util, job.gpu_mem_mb = seeded.gpu_util, seeded.mem_util, seeded.gpu_mem_mb
            ids.append(job_id)
    finally:
        store.dispose()
    return ids


def _update_run(url: str, directory: Path, conf: dict[str, Any], now: float, run_id: str) -> dict[str, Any]:
    """extract -> validate -> train_and_evaluate -> promote_or_keep, with the DAG's parameters from `conf`."""
    from lucid_core.update import extract_batch, promote_or_keep, train_and_evaluate, validate_batch

    batch = extract_batch(url, directory, conf["mode"], now, full_days=conf["full_days"])
    checked = validate_batch(batch)
    assert not checked["refused"], checked["refused"]
    evaluation = train_and_evaluate(url, checked, conf.get("recent_share", 0.2), run_id)
    return promote_or_keep(url, evaluation) | {"batch": batch}


@pytest.mark.slow
def test_demo_store_promotes_models_then_mails_a_drift_alert_to_the_sink(tmp_path, monkeypatch):
    demo = load_demo()
    home = tmp_path / "demo"
    (home / "lucid").mkdir(parents=True)
    monkeypatch.setenv("LUCID_HOME", str(home / "lucid"))
    monkeypatch.delenv("LUCID_REPORTS_DIR", raising=False)
    url = f"sqlite:///{home / 'lucid' / 'lucid.db'}"
    demo.register_hosts(home).dispose()
    now = time.time()
    rows, first, last = demo.seed_sample_history(url, now)
    assert rows == 400 and last < now - 7 * 86400 and first > now - 21 * 86400

    from lucid_core.runtime.store.schema import JobEventRow, JobRow
    from lucid_core.runtime.store.store import Store
    from lucid_core.update import extract_batch

    store = Store(url)
    with store.session() as s:  # every seeded row says what it is
        seeded = s.query(JobRow).filter(JobRow.job_id.startswith("sample-")).all()
        assert len(seeded) == 400 and all(j.end_reason == demo.SEEDED_NOTE and j.profile_emulated for j in seeded)
        assert s.query(JobEventRow).filter(JobEventRow.kind == "seeded").count() == 400
    store.dispose()
    # outside the default 7-day windows (tuner, daily fine-tune); inside the demo's full window
    assert extract_batch(url, tmp_path / "finetune", "finetune", now).job_rows == 0
    conf = demo.update_conf()
    started = time.perf_counter()
    train = _update_run(url, tmp_path / "train", conf, now, "demo_train")
    assert train["batch"].job_rows == 400
    assert {k: d["action"] for k, d in train["decisions"].items()} == {"duration": "promote", "throughput": "promote"}

    from lucid_core.models.registry import ModelRegistry
    from lucid_core.runtime.surfaces.queries import model_versions

    registry = ModelRegistry(home / "lucid" / "models" / "registry")
    assert registry.promoted_version("duration") == 1 and registry.promoted_version("throughput") == 1
    store = Store(url)
    active = {v.kind for v in model_versions(store) if v.active}
    store.dispose()
    assert active == {"duration", "throughput_forecaster"}  # what /lucid/models lists and the live round loads

    # the demo's jobs run (seconds long, where the seeded history ran for hours), then the second run
    ids = _finish_demo_jobs(demo, url, now + 60.0)
    later = now + 300.0
    check_conf = demo.update_conf(round(len(ids) / (rows + len(ids)), 6))
    check = _update_run(url, tmp_path / "check", check_conf, later, "demo_check")
    assert check["batch"].job_rows == rows + len(ids)
    assert check["evaluation"]["models"]["duration"]["recent_rows"] == len(ids)  # exactly the demo's jobs

    from lucid_core.update import drift_reports, save_drift_history

    reports = drift_reports(check, 1.25, 0.2)
    by_model = {r["model"]: r for r in reports}
    assert by_model["duration"]["drifted"] and by_model["duration"]["mae_ratio"] > 1.25, by_model["duration"]
    assert by_model["duration"]["version"] == 1
    history = save_drift_history(home / "lucid" / "reports" / "drift", "demo_check", reports, demo.ALERT_TO)
    assert json.loads(history.read_text())["alert_sent_to"] == demo.ALERT_TO  # the row /lucid/drift shows

    # the alert, as the DAG's alert task sends it, through the demo's SMTP sink and its connection
    from airflow.providers.smtp.notifications.smtp import SmtpNotifier

    from lucid_core.alerts import alert_message

    controller, sink, port = demo.start_smtp_sink(home / "mail" / "alerts.mbox")
    try:
        assert controller.hostname == "127.0.0.1"
        env = demo.demo_env(home, 8080, port, "test")
        monkeypatch.setenv("AIRFLOW_CONN_SMTP_DEFAULT", env["AIRFLOW_CONN_SMTP_DEFAULT"])
        message = alert_message(reports)
        assert message is not None
        SmtpNotifier(to=[demo.ALERT_TO], subject=message[0], html_content=message[1],
                     smtp_conn_id="smtp_default").notify({})
    finally:
        controller.stop()
    received = list(mailbox.mbox(str(home / "mail" / "alerts.mbox")))
    assert len(received) == 1 and sink.subjects == [received[0]["Subject"]]
    mail = received[0]
    assert mail["To"] == demo.ALERT_TO and "DRIFT" in mail["Subject"] and "duration" in mail["Subject"]
    parts = [p for p in mail.walk() if p.get_content_type() == "text/html"]
    text = parts[0].get_payload(decode=True).decode()
    assert f"{by_model['duration']['mae_ratio']:.3f}" in text and "Error ratio" in text
    assert time.perf_counter() - started < 240


def test_alert_message_is_none_without_drift_and_escapes_template_braces():
    from lucid_core.alerts import alert_message

    assert alert_message([{"drifted": False, "subject": "s", "body": "b"}]) is None
    subject, body = alert_message([{"drifted": True, "subject": "[Lucid] DRIFT {x}", "body": "a < b {{y}}"},
                                   {"drifted": False, "subject": "quiet", "body": "ok"}])
    assert subject == "[Lucid] DRIFT (x)" and "quiet" not in body
    assert "{" not in body and "&lt;" in body


def test_the_alert_says_the_errors_unit_the_version_checked_and_what_to_do():
    """The mail gave a duration MAE of 1.05 with no unit (it is log-seconds: read as seconds it looks harmless), did
    not say which version drifted while the same run had promoted another, and gave no next step."""
    from lucid_core.alerts import alert_message, check_drift

    report = check_drift("duration", [0.3] * 30, [1.2] * 30, {"gpus": [1.0] * 30}, {"gpus": [1.0] * 30})
    assert "Error unit: absolute error of log(1 + duration in seconds)" in report.body
    _, body = alert_message([report.to_dict() | {"body": report.body, "version": 3}])
    assert "Checked: version 3, the one serving before this run" in body
    assert "/lucid/drift" in body and "mode=full" in body


def test_seeded_history_ends_more_than_a_week_before_now_on_the_traces_weekdays(tmp_path):
    demo = load_demo()
    (tmp_path / "lucid").mkdir()
    url = f"sqlite:///{tmp_path / 'lucid' / 'lucid.db'}"
    demo.register_hosts(tmp_path).dispose()
    now = time.time()
    rows, first, last = demo.seed_sample_history(url, now)
    assert now - 14 * 86400 - 3600 < last < now - 7 * 86400
    assert time.gmtime(first).tm_wday == 0  # the trace starts on a Monday and still does
    # the seeded rows take the first sequence numbers: the demo's submissions number on after them
    from lucid_core.runtime.store.store import Store
    from lucid_core.runtime.surfaces.submission import JobRequest, submit

    store = Store(url)
    assert submit(store, JobRequest("true", gpus=1, user="u", vc="default", name="n")) == f"j{rows + 1:06d}"
    store.dispose()


def test_training_status_says_how_many_finished_jobs_training_needs(tmp_path):
    from lucid_core.update import extract_batch, minimum_rows, training_status, validate_batch

    demo = load_demo()
    (tmp_path / "lucid").mkdir()
    url = f"sqlite:///{tmp_path / 'lucid' / 'lucid.db'}"
    demo.register_hosts(tmp_path).dispose()
    update_dir = tmp_path / "reports" / "update"
    assert training_status(update_dir) == ""  # no run yet
    _, first, _ = demo.seed_sample_history(url, time.time())
    batch = extract_batch(url, update_dir / "early", "finetune", first + 2 * 3600)  # the trace's first two hours
    assert 0 < batch.job_rows < minimum_rows("job_log") == 20 and minimum_rows("throughput") == 12
    assert validate_batch(batch)["refused"]
    status = training_status(update_dir)
    assert status.startswith(f"the last Update Engine run found {batch.job_rows} of 20 finished jobs and "
                             f"{batch.slot_rows} of 12 10-minute submission slots (finetune window, 7 days)"), status
    assert status.endswith("training waits for more")


def test_demo_airflow_listens_on_loopback_with_parallelism_sized_to_the_machine(tmp_path, monkeypatch):
    demo = load_demo()
    monkeypatch.setattr(demo.os, "cpu_count", lambda: 6)
    env = demo.demo_env(tmp_path, 18123, 2525, "marker")
    assert env["AIRFLOW__API__HOST"] == "127.0.0.1" and env["AIRFLOW__API__PORT"] == "18123"
    assert env["AIRFLOW__CORE__PARALLELISM"] == "6"  # not Airflow's 32 LocalExecutor workers
    assert env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"].startswith("http://127.0.0.1:18123/")
    monkeypatch.setattr(demo.os, "cpu_count", lambda: None)
    assert demo.demo_env(tmp_path, 1, 2, "m")["AIRFLOW__CORE__PARALLELISM"] == "2"
