"""The DAGs parse cheaply and run end to end with dag.test() against a migrated metadata DB."""

from __future__ import annotations

import json
import os
import re
import time
from email import message_from_bytes
from pathlib import Path

import pytest
from lucid_af_support import REPO, SAMPLE_TRACE, seed_finished_jobs

DAG_IDS = {"lucid_scheduling_round", "lucid_update_engine", "lucid_system_tuner"}
PARSE_BUDGET_S = 5.0  # per file, well under Airflow's default dagbag_import_timeout (30 s)


def _dagbag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "dags"))


def test_every_dag_parses_without_errors_within_budget():
    bag = _dagbag()
    assert bag.import_errors == {}
    assert set(bag.dags) >= DAG_IDS
    for stat in bag.dagbag_stats:
        assert stat.duration.total_seconds() < PARSE_BUDGET_S, stat
    round_dag = bag.dags["lucid_scheduling_round"]
    assert round_dag.max_active_runs == 1 and not round_dag.catchup
    from lucid_core.config import load_live_config
    from lucid_core.runtime.round.deadlines import RoundDeadlines

    deadlines = RoundDeadlines.from_runtime(load_live_config().runtime)  # what the round's tasks run with
    for task_id, step in (("reconcile", "reconcile"), ("profile_bind_and_place", "decide"), ("carry_out", "carry_out")):
        assert round_dag.get_task(task_id).execution_timeout.total_seconds() == deadlines.step_timeout_s(step)
    tuner = bag.dags["lucid_system_tuner"]
    assert {"tprof_s", "nprof_gpus", "cprof_nodes", "tiny_threshold", "medium_threshold", "sharing",
            "update_cadence", "objective", "apply", "trace_path", "window_start"} <= set(tuner.params)
    assert tuner.get_task("simulate_configuration").is_mapped if hasattr(
        tuner.get_task("simulate_configuration"), "is_mapped") else True


def test_the_round_dags_time_limits_come_from_the_config_its_tasks_read(lucid_home, monkeypatch):
    """The DAG file read only LUCID_CONFIG while its tasks read LUCID_HOME/lucid.toml without it (the file the
    tuner applies to): with host calls given 120 s there, Airflow killed `reconcile` at 316 s while the round
    allowed itself 1,116 s."""
    from lucid_core.config import load_config
    from lucid_core.runtime.round.deadlines import RoundDeadlines

    monkeypatch.delenv("LUCID_CONFIG", raising=False)
    lucid_home.mkdir(parents=True, exist_ok=True)
    (lucid_home / "lucid.toml").write_text("[runtime]\nhost_call_deadline_s = 120\n")
    round_dag = _dagbag().dags["lucid_scheduling_round"]
    slow = RoundDeadlines.from_runtime(load_config(lucid_home / "lucid.toml").runtime)
    assert slow.step_timeout_s("reconcile") > RoundDeadlines.from_runtime(load_config(None, env={}).runtime) \
        .step_timeout_s("reconcile")
    for task_id, step in (("reconcile", "reconcile"), ("profile_bind_and_place", "decide"), ("carry_out", "carry_out")):
        assert round_dag.get_task(task_id).execution_timeout.total_seconds() == slow.step_timeout_s(step), task_id
    assert round_dag.dagrun_timeout.total_seconds() == slow.round_timeout_s + 60


def test_dag_files_import_nothing_heavy_at_parse_time():
    """Parsing a DAG file must not pull in pandas, GX, sklearn, interpret or the simulator."""
    import subprocess
    import sys

    code = ("import sys; from airflow.dag_processing.dagbag import DagBag; b = DagBag(dag_folder=sys.argv[1]); "
            "assert not b.import_errors, b.import_errors; "
            "heavy = [m for m in ('great_expectations', 'sklearn', 'interpret', 'lucid_core.sim.engine', "
            "'matplotlib', 'paramiko') if m in sys.modules]; print(heavy); assert not heavy, heavy")
    done = subprocess.run([sys.executable, "-c", code, str(REPO / "dags")], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]


def _state(run) -> str:
    return str(getattr(run.state, "value", run.state))


def _ti_states(run) -> dict[str, list[str]]:
    states: dict[str, list[str]] = {}
    for ti in run.get_task_instances():
        states.setdefault(ti.task_id, []).append(str(getattr(ti.state, "value", ti.state)))
    return states


def test_tuner_dag_runs_one_mapped_task_per_configuration(airflow_db, lucid_home, tmp_path, monkeypatch):
    monkeypatch.setenv("LUCID_CONFIG", str(tmp_path / "live.toml"))
    # the live configuration never lets a job yield: on 2 nodes the sample trace queues long enough
    # that this costs average JCT, so the grid's settings (all with yielding) beat it beyond the noise
    # (its aging, 16, is not among the grid's, so the applied file must have been written over)
    (tmp_path / "live.toml").write_text("[orchestrator]\naging = 16.0\nyield_margin = 0.0\n")
    dag = _dagbag().dags["lucid_system_tuner"]
    conf = {"trace_path": str(SAMPLE_TRACE), "trace_format": "generic", "main_nodes": 2,
            "tprof_s": [100, 300], "sharing": ["auto"], "aging": [0, 32], "update_cadence": ["daily"],
            "yield_margin": [4], "objective": "avg_jct", "apply": True,
            "medium_threshold": [0.85, 0.99]}  # 0.99 is above the Tiny threshold (0.95): those 4 are left out
    run = dag.test(run_conf=conf)
    states = _ti_states(run)
    assert _state(run) == "success", states
    assert states["simulate_configuration"] == ["success"] * (4 + 3)  # + the current configuration, 3 draws
    reports = list((lucid_home / "reports" / "tuner").glob("*/report.json"))
    assert len(reports) == 1
    summary = json.loads(reports[0].read_text())
    assert summary["configurations"] == 4 and summary["failed"] == 0
    assert summary["dropped"] == 4, summary.get("dropped_text")  # the report says what conflicting knobs left out
    jcts = [r["metrics"]["avg_jct_s"] for r in summary["ranked"]]
    assert jcts == sorted(jcts)
    assert (reports[0].parent / "objective.png").stat().st_size > 1000
    from lucid_core.config import load_config

    applied = load_config(tmp_path / "live.toml")
    best = summary["best"]["overrides"]
    assert summary["keep_current"] is False, summary["verdict"]
    assert applied.profiler.tprof_s == best["profiler.tprof_s"]
    assert applied.orchestrator.aging == best["orchestrator.aging"] in (0, 32)
    assert applied.orchestrator.yield_margin == best["orchestrator.yield_margin"] == 4  # the live file had 0
    # the report pages say the proposal was written, and where (they showed an applied and a proposed run alike)
    from fastapi.testclient import TestClient
    from lucid_airflow.web import create_lucid_app

    pages = TestClient(create_lucid_app(lambda: "sqlite://", lambda: lucid_home / "reports", protect=False))
    name = reports[0].parent.name
    assert f"the live config file {tmp_path / 'live.toml'} now holds this proposal" in pages.get(f"/tuner/{name}").text
    assert "Applied on " in pages.get("/tuner").text


def test_tuner_apply_step_is_skipped_unless_asked(airflow_db, lucid_home, tmp_path, monkeypatch):
    monkeypatch.setenv("LUCID_CONFIG", str(tmp_path / "live.toml"))
    dag = _dagbag().dags["lucid_system_tuner"]
    run = dag.test(run_conf={"trace_path": str(SAMPLE_TRACE), "main_nodes": 3, "tprof_s": [200],
                             "sharing": ["auto"], "apply": False})
    states = _ti_states(run)
    assert states["apply_best"] == ["skipped"], states
    assert not (tmp_path / "live.toml").exists()
    report = next((lucid_home / "reports" / "tuner").glob("*/report.json")).parent
    assert json.loads((report / "applied.json").read_text())["applied"] is False


def _store_connection(home: Path, monkeypatch) -> str:
    """A SQLite Lucid store in `home`, reachable from tasks as the lucid_db connection."""
    path = home / "lucid.db"
    monkeypatch.setenv("AIRFLOW_CONN_LUCID_DB", json.dumps({"conn_type": "sqlite", "host": str(path)}))
    return f"sqlite:///{path}"


def test_tuner_replays_the_stores_finished_jobs_when_no_trace_is_given(airflow_db, lucid_home, monkeypatch):
    url = _store_connection(lucid_home, monkeypatch)
    seeded = seed_finished_jobs(url)
    dag = _dagbag().dags["lucid_system_tuner"]
    run = dag.test(run_conf={"trace_path": "", "window_days": 3650, "main_nodes": 2, "tprof_s": [200],
                             "sharing": ["on", "off"]})  # (tprof 200, sharing auto) is the current row
    assert _state(run) == "success", _ti_states(run)
    summary = json.loads(next((lucid_home / "reports" / "tuner").glob("*/report.json")).read_text())
    assert summary["configurations"] == 2
    assert all(r["metrics"]["jobs"] == seeded for r in summary["ranked"])


def test_tuner_with_the_forms_defaults_replays_the_store_on_the_live_inventory(airflow_db, lucid_home, monkeypatch):
    """No trace and no node count: the store's finished jobs on the inventory's hosts, VCs and pool."""
    from lucid_core.runtime.hosts.inventory import HostSpec, add_host
    from lucid_core.runtime.store.store import Store

    url = _store_connection(lucid_home, monkeypatch)
    seeded = seed_finished_jobs(url, limit=60, gpus=1)
    store = Store(url)
    for name, pool, gpus in (("prof0", "profiling", 2), ("main0", "main", 2), ("main1", "main", 4)):
        add_host(store, HostSpec(name, pool=pool, executor="local", telemetry="emulated", gpus=gpus,
                                 workdir=str(lucid_home / name)))
    store.dispose()
    dag = _dagbag().dags["lucid_system_tuner"]
    defaults = {name: param.value for name, param in dag.params.items()}
    assert defaults["trace_path"] is None and defaults["main_nodes"] is None and defaults["window_start"] is None
    run = dag.test(run_conf={"window_days": 3650})
    assert _state(run) == "success", _ti_states(run)
    summary = json.loads(next((lucid_home / "reports" / "tuner").glob("*/report.json")).read_text())
    assert summary["main_nodes"] is None and len(summary["fleet"]["hosts"]) == 3
    assert "VC default: 2 main hosts, 6 GPUs; profiling pool: 1 host, 2 GPUs" in summary["cluster"]
    # around the current values: Tprof 100/200/400 x sharing auto/on/off, less the current configuration
    assert summary["configurations"] == 8 and summary["noise"]["draws"] == 3
    assert all(r["metrics"]["jobs"] == seeded for r in summary["ranked"])
    assert summary["verdict"] and summary["current"]["result"]["metrics"]["jobs"] == seeded


def test_a_scheduled_tuner_run_on_a_quiet_week_skips_in_its_first_task(airflow_db, lucid_home, monkeypatch, capfd):
    """Hosts, but no job finished in the last 7 days: expand_grid passed and each of the ~11 mapped tasks failed
    "nothing to replay" (in the worker's local time, no zone). The first task reads the window once and skips the
    run, saying why in UTC; no mapped task runs."""
    from lucid_core.runtime.hosts.inventory import HostSpec, add_host
    from lucid_core.runtime.store.store import Store

    url = _store_connection(lucid_home, monkeypatch)
    seed_finished_jobs(url, limit=30)  # March 2024: long before the scheduled run's 7-day window
    store = Store(url)
    for name, pool in (("prof0", "profiling"), ("main0", "main")):
        add_host(store, HostSpec(name, pool=pool, executor="local", telemetry="emulated", gpus=2,
                                 workdir=str(lucid_home / name)))
    store.dispose()
    run = _dagbag().dags["lucid_system_tuner"].test(run_conf={})  # a scheduled run's conf
    states = _ti_states(run)
    assert states["expand_grid"] == ["skipped"], states
    assert all(state == "skipped" for task, ran in states.items() for state in ran), states
    out = capfd.readouterr()
    assert re.search(r"the store has no finished job since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC: nothing to replay",
                     out.out + out.err), (out.out + out.err)[-3000:]


class _Inbox:
    def __init__(self) -> None:
        self.messages: list = []

    async def handle_DATA(self, server, session, envelope):  # aiosmtpd handler hook
        self.messages.append((envelope.rcpt_tos, message_from_bytes(envelope.content)))
        return "250 OK"


@pytest.fixture
def smtp_inbox(monkeypatch):
    """A real SMTP server on loopback (aiosmtpd) and the smtp_default connection pointing at it."""
    import socket

    from aiosmtpd.controller import Controller

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    inbox = _Inbox()
    controller = Controller(inbox, hostname="127.0.0.1", port=port)
    controller.start()
    monkeypatch.setenv("AIRFLOW_CONN_SMTP_DEFAULT", json.dumps({
        "conn_type": "smtp", "host": "127.0.0.1", "port": port,
        "extra": {"disable_tls": True, "disable_ssl": True, "from_email": "lucid@localhost", "timeout": 10}}))
    yield inbox
    controller.stop()


def test_update_engine_promotes_then_alerts_on_drift_over_smtp(airflow_db, lucid_home, smtp_inbox, monkeypatch):
    url = _store_connection(lucid_home, monkeypatch)
    seed_finished_jobs(url)
    dag = _dagbag().dags["lucid_update_engine"]
    now = time.time()
    # separated by a semicolon, as mail clients write it: the second recipient used to be lost
    conf = {"mode": "full", "full_days": 3650, "alert_to": "ops@example.org; Dev Team <dev@example.org>",
            "drift_checks_in_a_row": 1}  # one drifted check here; the counting is test_drift_persistence.py's
    first = dag.test(run_conf=conf, logical_date=None)
    assert _state(first) == "success", _ti_states(first)
    assert smtp_inbox.messages == []  # nothing promoted before: nothing can have drifted

    # the workload changes: the same users now run 20x longer jobs on 8 GPUs
    seed_finished_jobs(url, scale=20.0, gpus=8, offset_s=3 * 86400.0, prefix="late-")
    second = dag.test(run_conf=conf)
    states = _ti_states(second)
    assert _state(second) == "success", states
    assert len(smtp_inbox.messages) == 1, states
    recipients, message = smtp_inbox.messages[0]
    assert recipients == ["ops@example.org", "dev@example.org"]
    assert "DRIFT" in message["Subject"] and "duration" in message["Subject"]
    text = message.get_payload()[0].get_payload(decode=True).decode() if message.is_multipart() else \
        message.get_payload(decode=True).decode()
    assert "Error ratio" in text and "PSI" in text and "gpus" in text
    history = sorted((lucid_home / "reports" / "drift").glob("*.json"))
    duration = [r for h in history for r in json.loads(h.read_text())["reports"] if r["model"] == "duration"]
    assert duration and duration[-1]["mae_ratio"] > 1.25
    assert json.loads(history[-1].read_text())["alert_sent_to"] == "ops@example.org, dev@example.org"
    assert any(s["feature"] == "gpus" and s["psi"] > 0.2 for s in duration[-1]["shifts"])
    assert f"{duration[-1]['mae_ratio']:.3f}" in text
    shapes = list((lucid_home / "reports" / "models" / "duration").glob("v*/*.png"))
    assert shapes, "shape-function plots of the promoted duration model are published"
    assert (lucid_home / "reports" / "models" / "packing" / "tree.txt").read_text().strip()
    from lucid_core.models.registry import ModelRegistry

    registry = ModelRegistry(lucid_home / "models" / "registry")
    assert registry.promoted_version("duration") is not None and registry.versions("duration") == [1, 2]
    # the live round picks the promoted models up from the store
    from lucid_core.config import LucidConfig
    from lucid_core.runtime.round.live_models import policy_models
    from lucid_core.runtime.round.snapshot import load_snapshot
    from lucid_core.runtime.store.store import Store

    store = Store(url)
    duration_model, _, forecaster, sources = policy_models(LucidConfig(), load_snapshot(store, time.time()))
    store.dispose()
    assert sources["duration"].startswith("promoted version"), sources
    assert sources["throughput"].startswith("promoted version"), sources
    assert type(duration_model).__name__ == "DurationModel"
    assert forecaster.forecast(time.time()).jobs_per_slot >= 0
    assert time.time() - now < 600


def test_update_engine_skips_when_the_store_has_no_finished_job(airflow_db, lucid_home, monkeypatch):
    url = _store_connection(lucid_home, monkeypatch)
    from lucid_core.runtime.store.store import Store

    Store(url).dispose()  # an empty, migrated store
    run = _dagbag().dags["lucid_update_engine"].test(run_conf={"mode": "finetune"})
    states = _ti_states(run)
    assert states["extract"] == ["skipped"] and states["train_and_evaluate"] == ["skipped"], states


def test_update_engine_skips_training_when_the_batch_has_too_few_rows(airflow_db, lucid_home, monkeypatch, capfd):
    """1 to 19 finished jobs (a new or small fleet): validate failed the run every day. Training is skipped with
    the reason; the run does not fail, and the drift check runs (nothing serves yet: nothing to check)."""
    url = _store_connection(lucid_home, monkeypatch)
    seed_finished_jobs(url, limit=10)  # below the suite's minimum row count
    dag = _dagbag().dags["lucid_update_engine"]
    run = dag.test(run_conf={"mode": "full", "full_days": 3650})
    states = _ti_states(run)
    assert _state(run) == "success", states
    assert states["validate"] == ["success"] and states["train_and_evaluate"] == ["skipped"], states
    assert states["promote_or_keep"] == ["skipped"] and states["check_drift"] == ["success"], states
    report = json.loads(next((lucid_home / "reports" / "update").glob("*/validation.json")).read_text())
    assert report["too_few_rows"] is True
    assert "expect_table_row_count_to_be_between" in report["refused"]
    # it says how many rows it found, how many it needs, and what to do
    assert "job_log: the batch fails: 10 rows found, at least 20 required" in report["refused"], report["refused"]
    assert "what to do: let at least 20 jobs finish" in report["refused"]
    assert Path(report["job_log"]["clean_path"]).exists()
    out = capfd.readouterr()
    assert "training skipped: job_log: the batch fails: 10 rows found, at least 20 required" in out.out + out.err


def _recent_offset_s(days_ago: float) -> float:
    """seed_finished_jobs' offset that submits the sample trace's first job `days_ago` days before now."""
    from lucid_core.sim.traces import read_trace

    return time.time() - days_ago * 86400.0 - read_trace(SAMPLE_TRACE, "generic").epoch.timestamp()


def test_a_short_batch_skips_training_and_still_alerts_on_the_serving_models_drift(airflow_db, lucid_home,
                                                                                    smtp_inbox, monkeypatch, capfd):
    """check_drift hung on promote_or_keep: a batch refused for too few rows skipped the drift check of the model
    already serving, so its drift went unmailed. Now training skips and the serving model is checked on the batch."""
    url = _store_connection(lucid_home, monkeypatch)
    seed_finished_jobs(url)
    dag = _dagbag().dags["lucid_update_engine"]
    conf = {"alert_to": "ops@example.org", "drift_checks_in_a_row": 1}
    first = dag.test(run_conf={**conf, "mode": "full", "full_days": 3650})
    assert _state(first) == "success", _ti_states(first)
    # a quiet week: 12 jobs in the fine-tune window (submitted 6 days ago, ended days ago), 20x longer on 8 GPUs
    seed_finished_jobs(url, limit=12, scale=20.0, gpus=8, offset_s=_recent_offset_s(6.0), prefix="late-")
    second = dag.test(run_conf={**conf, "mode": "finetune", "finetune_days": 7})
    states = _ti_states(second)
    assert states["validate"] == ["success"] and states["train_and_evaluate"] == ["skipped"], states
    assert states["check_drift"] == ["success"] and states["alert"] == ["success"], states
    out = capfd.readouterr()
    assert "training skipped: job_log: the batch fails: 12 rows found, at least 20 required" in out.out + out.err
    assert len(smtp_inbox.messages) == 1, states
    recipients, message = smtp_inbox.messages[0]
    assert recipients == ["ops@example.org"] and "DRIFT" in message["Subject"] and "duration" in message["Subject"]
    history = json.loads(sorted((lucid_home / "reports" / "drift").glob("*.json"))[-1].read_text())
    duration = next(r for r in history["reports"] if r["model"] == "duration")
    assert duration["drifted"] and duration["version"] == 1 and history["alert_sent_to"] == "ops@example.org"


def test_a_batch_refused_for_bad_data_fails_validate_and_mails_the_refusal(airflow_db, lucid_home, smtp_inbox,
                                                                           monkeypatch):
    """Bad data still fails the run loudly; no drift check runs on it, and the refusal itself is mailed (it reached
    nobody: the alert task hung on the drift check)."""
    import sqlalchemy as sa

    from lucid_core.runtime.store.schema import JobRow
    from lucid_core.runtime.store.store import Store

    url = _store_connection(lucid_home, monkeypatch)
    seed_finished_jobs(url, limit=40)
    store = Store(url)
    with store.session() as session:  # a quarter of the rows out of range: far above the 5% quarantine allowed
        session.execute(sa.update(JobRow).where(JobRow.seq <= 10).values(gpu_util=150.0))
    store.dispose()
    run = _dagbag().dags["lucid_update_engine"].test(run_conf={"mode": "full", "full_days": 3650,
                                                               "alert_to": "ops@example.org"})
    states = _ti_states(run)
    assert _state(run) == "failed", states
    assert states["validate"] == ["failed"] and states["train_and_evaluate"] == ["upstream_failed"], states
    assert states["check_drift"] == ["upstream_failed"] and states["alert"] == ["success"], states
    assert len(smtp_inbox.messages) == 1
    recipients, message = smtp_inbox.messages[0]
    assert recipients == ["ops@example.org"] and "training refused" in message["Subject"]
    path = next((lucid_home / "reports" / "update").glob("*/validation.json"))
    report = json.loads(path.read_text())
    assert report["too_few_rows"] is False and "10 of 40 rows" in report["refused"], report["refused"]
    assert report["alert_sent_to"] == "ops@example.org"  # a retry of the alert task sends it no second time


@pytest.mark.parametrize(("conf", "said"), [
    ({"window_start": "2024/03/04"}, "window_start='2024/03/04' is not an ISO date or time"),
    ({"trace_format": "philly"}, "not a philly trace"),
    ({"window_days": 30}, "window_days chooses how much of the store's history to replay, and trace_path is given"),
])
def test_a_tuner_run_on_a_trace_it_cannot_read_as_asked_fails_before_any_mapped_task(airflow_db, lucid_home,
                                                                                     monkeypatch, capfd, conf, said):
    """A window date that is no ISO date or a trace_format the file is not failed all eleven mapped tasks with the
    same error (naming `start`, not window_start); window_days beside a trace_path was ignored without a word."""
    _store_connection(lucid_home, monkeypatch)
    run = _dagbag().dags["lucid_system_tuner"].test(run_conf={
        "trace_path": str(SAMPLE_TRACE), "main_nodes": 2, "tprof_s": [200], **conf})
    states = _ti_states(run)
    assert states["expand_grid"] == ["failed"], states
    assert "simulate_configuration" not in states or not any(x == "failed" for x in states["simulate_configuration"])
    out = capfd.readouterr()
    assert said in out.out + out.err


def test_runs_from_the_trigger_form_which_sends_every_parameter_pass_the_first_task(airflow_db, lucid_home,
                                                                                      monkeypatch):
    """Airflow's trigger form sends every parameter's value in the run's conf: the checks of inputs a run ignores
    took the form's window_days (beside a trace_path) and smtp_conn_id (no such connection where no mail is
    wanted) for inputs a person gave, and failed every form run of both DAGs."""
    url = _store_connection(lucid_home, monkeypatch)
    seed_finished_jobs(url, limit=30)
    monkeypatch.delenv("AIRFLOW_CONN_SMTP_DEFAULT", raising=False)
    bag = _dagbag()
    form = {name: param.value for name, param in bag.dags["lucid_system_tuner"].params.items()}
    run = bag.dags["lucid_system_tuner"].test(run_conf={**form, "trace_path": str(SAMPLE_TRACE), "main_nodes": 2,
                                                        "tprof_s": [200], "around": ["sharing"]})
    assert _ti_states(run)["expand_grid"] == ["success"], _ti_states(run)
    form = {name: param.value for name, param in bag.dags["lucid_update_engine"].params.items()}
    run = bag.dags["lucid_update_engine"].test(run_conf={**form, "mode": "full", "full_days": 3650})
    assert _ti_states(run)["extract"] == ["success"], _ti_states(run)


@pytest.mark.parametrize(("dag_id", "conf", "failed", "said"), [
    ("lucid_system_tuner", {"main_nodes": 2, "tprof_s": [200], "sharng": ["off"]}, "expand_grid",
     "run conf key 'sharng' is not a parameter of this DAG (did you mean 'sharing'?)"),  # a typo
    ("lucid_system_tuner", {"main_nodes": 2, "tprof_s": [200], "trace_path": "/etc/hostname"}, "expand_grid",
     "is outside the folders tuner runs may read traces from"),
    ("lucid_system_tuner", {"main_nodes": 2, "tprof_s": [200], "window_start": "2099-01-01"}, "expand_grid",
     "window_start says how to read trace_path's file, and no trace_path is given"),
    ("lucid_system_tuner", {"main_nodes": 2, "tprof_s": [200], "trace_format": "philly"}, "expand_grid",
     "trace_format says how to read trace_path's file, and no trace_path is given"),
    ("lucid_update_engine", {"mode": "full", "smtp_conn_id": "nope"}, "extract",
     "smtp_conn_id 'nope' names no Airflow connection the alert could be sent through"),
    ("lucid_system_tuner", {"main_nodes": 2, "tprof_s": list(range(100, 1100, 10)),
                            "aging": list(range(0, 100, 2)), "around": [], "max_configurations": 64}, "expand_grid",
     "the grid has 5,000 combinations, more than max_configurations=64"),
    ("lucid_update_engine", {"mode": "full", "finetune_dayz": 3}, "extract",
     "run conf key 'finetune_dayz' is not a parameter of this DAG (did you mean 'finetune_days'?)"),
    ("lucid_update_engine", {"mode": "full", "alert_to": "ops at example.org"}, "extract",
     "alert_to: 'ops at example.org' is not an email address"),
])
def test_a_run_whose_inputs_cannot_be_what_was_meant_fails_in_its_first_task(airflow_db, lucid_home, monkeypatch,
                                                                              capfd, dag_id, conf, failed, said):
    """Each of these used to run: a typo'd key with the default, any file the worker could read, a window the
    store replay ignores, a grid of 5,000 combinations built before max_configurations was looked at, an alert
    that would reach nobody. Now the run's first task fails, saying why, before any simulating or training."""
    url = _store_connection(lucid_home, monkeypatch)
    seed_finished_jobs(url, limit=30)
    run = _dagbag().dags[dag_id].test(run_conf=conf)
    states = _ti_states(run)
    assert states[failed] == ["failed"], states
    assert not any(state == ["success"] for task, state in states.items() if task != failed), states
    out = capfd.readouterr()
    assert said in out.out + out.err
