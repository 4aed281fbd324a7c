"""The scheduling-round DAG drives real job processes on local emulated GPU hosts to the end."""

from __future__ import annotations

import json
import time
from pathlib import Path

from lucid_af_support import REPO


def _dag():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(REPO / "dags")).dags["lucid_scheduling_round"]


def test_round_dag_profiles_places_and_finishes_jobs(airflow_db, lucid_home, tmp_path, monkeypatch):
    from lucid_core.runtime.hosts.inventory import HostSpec, add_host
    from lucid_core.runtime.store.schema import DecisionRow, JobRow
    from lucid_core.runtime.store.store import Store
    from lucid_core.runtime.surfaces.submission import JobRequest, submit

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
    long_a = submit(store, JobRequest("sleep 12", gpus=1, user="bob", vc="default", name="train-a"))
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


def _ssh_connection_env(monkeypatch, cluster, name: str, host_key: str | None = None) -> None:
    """The host's credentials as an Airflow SSH connection (what a secrets backend would hold)."""
    host = cluster.hosts[name]
    public = (host_key or Path(str(host.host_key) + ".pub").read_text()).split()
    monkeypatch.setenv(f"AIRFLOW_CONN_LUCID_HOST_{name.upper()}", json.dumps({
        "conn_type": "ssh", "host": "127.0.0.1", "port": host.port, "login": cluster.user,
        "extra": {"private_key": cluster.client_key.read_text(), "host_key": f"{public[0]} {public[1]}"}}))


def _ssh_store(tmp_path, lucid_home, monkeypatch, cluster):
    from lucid_core.runtime.hosts.inventory import HostSpec, add_host
    from lucid_core.runtime.store.store import Store

    db = lucid_home / "lucid.db"
    monkeypatch.setenv("AIRFLOW_CONN_LUCID_DB", json.dumps({"conn_type": "sqlite", "host": str(db)}))
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    monkeypatch.setenv("LUCID_KNOWN_HOSTS", str(empty))  # only the connections' host keys are trusted
    config = tmp_path / "lucid.toml"
    config.write_text("[profiler]\ntprof_s = 2.0\nin_place = false\n")
    monkeypatch.setenv("LUCID_CONFIG", str(config))
    store = Store(f"sqlite:///{db}")
    for name, pool in (("prof0", "profiling"), ("main0", "main")):
        # the row's address, port and key are wrong on purpose: the Airflow connection must win
        add_host(store, HostSpec(name, address="192.0.2.1", port=1, pool=pool, executor="ssh",
                                 telemetry="emulated", workdir=str(tmp_path / f"af_runs_{name}"), gpus=2))
    return store


def test_round_dag_reaches_ssh_hosts_through_airflow_connections(airflow_db, lucid_home, tmp_path, monkeypatch,
                                                                 sshd_hosts):
    from lucid_core.runtime.store.schema import JobRow
    from lucid_core.runtime.surfaces.submission import JobRequest, submit

    store = _ssh_store(tmp_path, lucid_home, monkeypatch, sshd_hosts)
    for name in ("prof0", "main0"):
        _ssh_connection_env(monkeypatch, sshd_hosts, name)
    # 25 s: the job must outlive its 2 s profiling window until a round stops it there, and one `dag.test()` round
    # took about 10 s on 2 loaded cores in CI (at 12 s the job once ended inside its profiling run)
    job = submit(store, JobRequest("sleep 25", gpus=1, user="ann", vc="default", name="train"))
    dag = _dag()
    deadline = time.monotonic() + 150
    while True:
        run = dag.test()
        assert str(getattr(run.state, "value", run.state)) == "success"
        with store.session() as s:
            row = s.get(JobRow, job)
            state, ended_in_profiling = row.state, row.ended_in_profiling
        if state in {"COMPLETED", "FAILED"}:
            break
        assert time.monotonic() < deadline, state
        time.sleep(1.0)
    assert state == "COMPLETED" and not ended_in_profiling
    assert any((tmp_path / "af_runs_main0").iterdir()), "the job ran on main0 through SSH"


def test_round_dag_refuses_a_host_whose_key_does_not_match_its_connection(airflow_db, lucid_home, tmp_path,
                                                                          monkeypatch, sshd_hosts):
    from lucid_core.runtime.store.schema import HostRow, JobRow
    from lucid_core.runtime.surfaces.submission import JobRequest, submit

    store = _ssh_store(tmp_path, lucid_home, monkeypatch, sshd_hosts)
    other = Path(str(sshd_hosts.hosts["main1"].host_key) + ".pub").read_text()
    _ssh_connection_env(monkeypatch, sshd_hosts, "prof0", host_key=other)  # someone else's key
    _ssh_connection_env(monkeypatch, sshd_hosts, "main0")
    job = submit(store, JobRequest("sleep 1", gpus=1, user="ann", vc="default", name="train"))
    run = _dag().test()  # one round: the profiling launch on prof0 must be refused
    assert str(getattr(run.state, "value", run.state)) == "success"
    with store.session() as s:
        prof = s.get(HostRow, "prof0")
        row = s.get(JobRow, job)
        reachable, error, state = prof.reachable, prof.last_error or "", row.state
    from lucid_core.runtime.store.schema import JobEventRow

    with store.session() as s:
        events = [(e.kind, e.message) for e in s.query(JobEventRow).filter(JobEventRow.job_id == job)]
    assert not reachable and "host key" in error.lower(), (error, state, events)
    assert state != "COMPLETED" and not any(kind == "launched" for kind, _ in events), events
    assert not (tmp_path / "af_runs_prof0").exists() or not any((tmp_path / "af_runs_prof0").iterdir())
