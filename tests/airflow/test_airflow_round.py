"""The scheduling-round DAG drives real job processes on local emulated GPU hosts to the end."""

from __future__ import annotations

import json
import time

from lucid_af_support import REPO


def _dag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "dags")).dags["lucid_scheduling_round"]


def test_round_dag_profiles_places_and_finishes_jobs(airflow_db, lucid_home, tmp_path, monkeypatch):
    from lucid_core.runtime.inventory import HostSpec, add_host
    from lucid_core.runtime.schema import DecisionRow, JobRow
    from lucid_core.runtime.store import Store
    from lucid_core.runtime.submission import JobRequest, submit

    db = lucid_home / "lucid.db"
    monkeypatch.setenv("AIRFLOW_CONN_LUCID_DB", json.dumps({"conn_type": "sqlite", "host": str(db)}))
    config = tmp_path / "lucid.toml"
    config.write_text("[profiler]\ntprof_s = 2.0\nin_place = false\n[forecast]\nmode_check_interval_s = 5.0\n")
    monkeypatch.setenv("LUCID_CONFIG", str(config))
    store = Store(f"sqlite:///{db}")
    for name, pool in (("prof0", "profiling"), ("main0", "main")):
        add_host(store, HostSpec(name, pool=pool, executor="local", telemetry="emulated",
                                 workdir=str(tmp_path / name), gpus=2))
    quick = submit(store, JobRequest("exit 0", gpus=1, user="ann", vc="default", name="debug"))
    long_a = submit(store, JobRequest("sleep 6", gpus=1, user="bob", vc="default", name="train-a"))
    failing = submit(store, JobRequest("sleep 3; exit 3", gpus=1, user="cy", vc="default", name="train-b"))
    dag = _dag()
    deadline = time.monotonic() + 120
    rounds = 0
    while True:
        run = dag.test()
        rounds += 1
        assert str(getattr(run.state, "value", run.state)) == "success"
        with store.session() as s:
            jobs = {j.job_id: j for j in s.query(JobRow).all()}
        if all(j.state in {"COMPLETED", "FAILED", "CANCELLED"} for j in jobs.values()):
            break
        assert time.monotonic() < deadline, {k: (j.state, j.pending_reason) for k, j in jobs.items()}
        time.sleep(1.0)
    assert jobs[quick].state == "COMPLETED" and jobs[quick].ended_in_profiling
    assert jobs[long_a].state == "COMPLETED" and not jobs[long_a].ended_in_profiling
    assert jobs[failing].state == "FAILED" and jobs[failing].exit_code == 3
    with store.session() as s:
        kinds = {d.kind for d in s.query(DecisionRow).all()}
        reasons = [d.reason for d in s.query(DecisionRow).all()]
    assert {"StartProfiling", "Place"} <= kinds or {"start_profiling", "place"} <= kinds, kinds
    assert all(reasons), "every decision carries a reason"
    assert rounds >= 3
