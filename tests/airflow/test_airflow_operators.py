"""LucidSubmitJobOperator, LucidJobTrigger and LucidJobSensor against a store whose local hosts run real
processes, while scheduling rounds run in a background thread (as the scheduling DAG would)."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
from lucid_af_support import REPO

EXAMPLE = REPO / "include" / "airflow" / "example_lucid_training.py"
# sleeps past the profiling window, then fails unless the manifest `prepare` wrote was passed on
TRAIN_OK = "sh -c 'sleep 3; test -f \"$2\"' train"


def _state(value) -> str:
    return str(getattr(value, "value", value))


class RoundLoop:
    """Scheduling rounds on the local executor every 0.3 s in a thread, until stopped."""

    def __init__(self, url: str) -> None:
        from lucid_core.config import LucidConfig
        from lucid_core.runtime.hosts.local_executor import local_executor
        from lucid_core.runtime.round.scheduling_round import RoundSettings, SchedulingRound
        from lucid_core.runtime.store.store import Store

        self.store = Store(url)
        config = LucidConfig().with_overrides({"profiler.tprof_s": 1, "profiler.in_place": False,
                                               "forecast.mode_check_interval_s": 1})
        settings = RoundSettings(stop_grace_s=1.0, telemetry_interval_s=0.25, launch_grace_s=30, lease_ttl_s=5,
                                 holder="operator-test")
        self._round = lambda: SchedulingRound(self.store, local_executor(), config, settings).run()
        self._stop = threading.Event()
        self.errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._loop, name="lucid-rounds", daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._round()
            except Exception as exc:  # surfaced by the test, not swallowed
                self.errors.append(exc)
            self._stop.wait(0.3)

    def __enter__(self) -> RoundLoop:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self.store.dispose()


@pytest.fixture
def lucid_store(airflow_db, lucid_home, tmp_path, monkeypatch):
    """A migrated SQLite store with a 1-GPU local profiling host and a 2-GPU local main host in VC default,
    reached by the tasks through the `lucid_db` connection."""
    from lucid_core.runtime.hosts.inventory import HostSpec, add_host
    from lucid_core.runtime.store.store import Store

    db = lucid_home / "lucid.db"
    monkeypatch.setenv("AIRFLOW_CONN_LUCID_DB", json.dumps({"conn_type": "sqlite", "host": str(db)}))
    store = Store(f"sqlite:///{db}")
    add_host(store, HostSpec("p0", executor="local", pool="profiling", telemetry="emulated", gpus=1,
                             workdir=str(tmp_path / "p0")))
    add_host(store, HostSpec("m0", executor="local", telemetry="emulated", gpus=2, workdir=str(tmp_path / "m0")))
    yield store
    store.dispose()


def _jobs(store) -> dict:
    from lucid_core.runtime.store.schema import JobRow

    with store.session() as s:
        return {j.job_id: j for j in s.query(JobRow).all()}


def _example_dag():
    """The example DAG, written to the metadata DB first: dag.test() only serializes the DAGs-folder bundle,
    and the example lives outside dags/ on purpose."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db

    bag = DagBag(dag_folder=str(EXAMPLE))
    assert not bag.import_errors, bag.import_errors
    DagBundlesManager().sync_bundles_to_db()
    sync_bag_to_db(bag, "dags-folder", None)
    return bag.dags["example_lucid_training"]


def _tis(run) -> dict:
    return {ti.task_id: ti for ti in run.get_task_instances()}


def _xcom(run, task_id: str, key: str = "return_value"):
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.query(XComModel).filter_by(dag_id=run.dag_id, run_id=run.run_id, task_id=task_id,
                                                  key=key).one()
        return XComModel.deserialize_value(row)


def _conf(tmp_path, script: str) -> dict:
    return {"data_root": str(tmp_path / "data"), "train_script": script, "vc": "default", "user": "ann"}


@pytest.mark.parametrize("deferrable", [True, False], ids=["deferred", "polling-in-worker"])
def test_example_dag_trains_on_the_fleet_then_evaluates(lucid_store, tmp_path, deferrable):
    dag = _example_dag()
    train = dag.task_dict["train"]
    train.deferrable, train.poll_interval = deferrable, 1
    with RoundLoop(lucid_store.url) as rounds:
        run = dag.test(run_conf=_conf(tmp_path, TRAIN_OK))
    assert not rounds.errors, rounds.errors
    tis = _tis(run)
    assert {k: _state(ti.state) for k, ti in tis.items()} == {"prepare": "success", "train": "success",
                                                             "evaluate": "success"}
    assert _state(run.state) == "success"
    (job_id, job), = _jobs(lucid_store).items()
    assert job.state == "COMPLETED" and job.exit_code == 0
    manifest = str(tmp_path / "data" / "manifest.json")
    assert job.command.endswith(f"--manifest {manifest}") and job.env == {"DATA_MANIFEST": manifest}
    assert job.user == "ann" and job.vc == "default" and job.name == f"example-{run.run_id}"
    # the task waited for the job: it ended after the round recorded the job's end
    assert tis["train"].end_date.timestamp() >= job.end_time > job.start_time
    assert _xcom(run, "train") == job_id and _xcom(run, "train", "job_id") == job_id
    assert _xcom(run, "evaluate") == {"job_id": job_id, "state": "COMPLETED",
                                      "runtime_s": pytest.approx(job.end_time - job.start_time),
                                      "ended_in_profiling": job.ended_in_profiling}
    # deferred: the wait ran in a trigger (dag.test runs it in line); polling: it never left the worker
    assert (tis["train"].trigger_id is not None) is deferrable


def test_a_failing_job_fails_the_task_with_its_reason_and_each_retry_submits_anew(lucid_store, tmp_path, capfd):
    from datetime import timedelta

    dag = _example_dag()
    train = dag.task_dict["train"]
    train.poll_interval, train.retries, train.retry_delay = 1, 1, timedelta(0)
    with RoundLoop(lucid_store.url) as rounds:
        run = dag.test(run_conf=_conf(tmp_path, "sleep 1; exit 1;"))
    assert not rounds.errors, rounds.errors
    tis = _tis(run)
    assert _state(tis["train"].state) == "failed" and _state(tis["evaluate"].state) == "upstream_failed"
    assert _state(run.state) == "failed"
    jobs = _jobs(lucid_store)
    assert len(jobs) == 2, "the retry (try 2) submits a job of its own"
    assert [(j.state, j.exit_code) for j in jobs.values()] == [("FAILED", 1), ("FAILED", 1)]
    assert len({j.idempotency_key for j in jobs.values()}) == 2
    out = capfd.readouterr().out
    for job_id, job in jobs.items():
        assert f"Lucid job {job_id} FAILED: {job.end_reason}" in out
    assert all(j.end_reason == "exited with code 1" for j in jobs.values())


def test_the_operator_passes_a_time_limit_and_preemptible_and_fails_with_the_jobs_reason(lucid_store, tmp_path,
                                                                                         capfd):
    """`time_limit` bounds the job's running time (queued time does not count, unlike execution_timeout): the job
    is stopped past it and the task fails with its reason; `preemptible` reaches the job (the operator dropped it)."""
    from datetime import timedelta

    dag = _example_dag()
    train = dag.task_dict["train"]
    train.poll_interval, train.time_limit, train.preemptible = 1, timedelta(seconds=2), True
    started = time.monotonic()
    with RoundLoop(lucid_store.url) as rounds:
        run = dag.test(run_conf=_conf(tmp_path, "sleep 120;"))
    assert not rounds.errors, rounds.errors
    assert time.monotonic() - started < 100, "the task waited for the 120 s job"
    assert _state(_tis(run)["train"].state) == "failed"
    (job,) = _jobs(lucid_store).values()
    assert (job.state, job.time_limit_s, job.preemptible) == ("FAILED", 2.0, True), job.end_reason
    assert "ran past its time limit of 2 s" in job.end_reason
    assert f"Lucid job {job.job_id} FAILED: {job.end_reason}" in capfd.readouterr().out


def _run_a_long_job_past_its_timeout(dag, store, tmp_path):
    """The example DAG on a 120 s job, with rounds running until every job it left is CANCELLED (30 s at most);
    the run. The rounds must have reported no error."""
    with RoundLoop(store.url) as rounds:
        run = dag.test(run_conf=_conf(tmp_path, "sleep 120;"))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and any(j.state != "CANCELLED" for j in _jobs(store).values()):
            time.sleep(0.5)
    assert not rounds.errors, rounds.errors
    return run


@pytest.mark.parametrize("deferrable", [True, False], ids=["deferred", "polling-in-worker"])
def test_a_task_that_times_out_cancels_its_job(lucid_store, tmp_path, capfd, deferrable):
    """execution_timeout is a hard limit either way: the job is cancelled, not left holding GPUs. (Airflow
    kills nothing when a deferred task's timeout passes, so the trigger ends the wait at the deadline.)"""
    from datetime import timedelta

    dag = _example_dag()
    train = dag.task_dict["train"]
    train.poll_interval, train.deferrable, train.execution_timeout = 1, deferrable, timedelta(seconds=8)
    started = time.monotonic()
    run = _run_a_long_job_past_its_timeout(dag, lucid_store, tmp_path)
    assert time.monotonic() - started < 100, "the task waited for the 120 s job"
    assert _state(_tis(run)["train"].state) == "failed"
    (job,) = _jobs(lucid_store).values()
    assert job.cancel_requested and job.state == "CANCELLED", (job.state, job.end_reason)
    assert f"{job.job_id}" in capfd.readouterr().out


def test_a_retry_after_the_task_cancelled_its_job_at_its_timeout_submits_anew(lucid_store, tmp_path, capfd):
    """The task's own cancel (at its execution_timeout, or when it is killed) is no person's: the retry must not
    take the cancelled job over and fail for good as if a person had cancelled it; it submits anew."""
    from datetime import timedelta

    dag = _example_dag()
    train = dag.task_dict["train"]
    train.poll_interval, train.deferrable, train.execution_timeout = 1, False, timedelta(seconds=6)
    train.retries, train.retry_delay = 1, timedelta(0)
    run = _run_a_long_job_past_its_timeout(dag, lucid_store, tmp_path)
    train_ti = _tis(run)["train"]
    assert _state(train_ti.state) == "failed" and train_ti.try_number == 2
    jobs = _jobs(lucid_store)
    assert len(jobs) == 2, "the retry took over the job its first try cancelled at the timeout"
    assert all(j.cancel_requested and j.state == "CANCELLED" for j in jobs.values())
    assert "cancelled outside this task" not in capfd.readouterr().out


def test_executing_the_same_try_again_reattaches_to_its_job(lucid_store, tmp_path, capfd):
    """A worker lost after submitting runs the same try again: the operator finds its job, submits nothing."""
    from airflow.sdk.definitions.dag import _run_task  # dag.test()'s own way of running one task instance

    dag = _example_dag()
    dag.task_dict["train"].poll_interval = 1
    dag.task_dict["train"].gpus = "{{ 1 }}"  # rendered to text: the reattach's log line took it as a number
    with RoundLoop(lucid_store.url) as rounds:
        run = dag.test(run_conf=_conf(tmp_path, TRAIN_OK))
        (job_id, first), = _jobs(lucid_store).items()
        train_ti = _tis(run)["train"]
        try_number = train_ti.try_number
        _run_task(ti=train_ti, task=dag.task_dict["train"], run_triggerer=True)
    assert not rounds.errors, rounds.errors
    again = _tis(run)["train"]
    assert again.try_number == try_number and _state(again.state) == "success"
    jobs = _jobs(lucid_store)
    assert list(jobs) == [job_id] and jobs[job_id].submit_time == first.submit_time
    assert _xcom(run, "train") == job_id
    assert capfd.readouterr().out.count(f"Lucid job {job_id} submitted") == 2, "the operator ran twice"


def test_idempotency_key_is_per_try_and_fits_the_store():
    from lucid_airflow.operators import task_idempotency_key, task_lineage

    from lucid_core.runtime.surfaces.submission import MAX_IDEMPOTENCY_KEY

    lineage = task_lineage("d" * 250, "t" * 250, "manual__" + "r" * 240, 7, "2026-02-01T00:00:00+00:00", 0)
    key = task_idempotency_key(lineage, 1, "ti-1")
    assert len(key) <= MAX_IDEMPOTENCY_KEY and key.startswith(lineage)
    assert key == task_idempotency_key(lineage, 1, "ti-1")
    assert key != task_idempotency_key(lineage, 2, "ti-2") and task_idempotency_key(lineage, 2, "ti-2").startswith(
        lineage), "a retry is a new key of the same lineage"
    assert lineage != task_lineage("d" * 250, "t" * 250, "manual__" + "r" * 240, 8, "2026-02-01T00:00:00+00:00", 0)
    # the parts are JSON-quoted: ids with separators in them cannot collide
    assert task_lineage("a:b", "c", "r", -1, "s", 0) != task_lineage("a", "b:c", "r", -1, "s", 0)
    # a DAG run made again keeps its run_id, not its start; a cleared task's run counts one more clear
    assert task_lineage("d", "t", "r", -1, "s1", 0) != task_lineage("d", "t", "r", -1, "s2", 0)
    assert task_lineage("d", "t", "r", -1, "s1", 0) != task_lineage("d", "t", "r", -1, "s1", 1)
    # a clear that leaves the run's state (and clear count) alone still starts the task's tries again later
    assert task_lineage("d", "t", "r", -1, "s1", 0, 1) != task_lineage("d", "t", "r", -1, "s1", 0, 3)


def test_the_lineage_follows_airflows_reckoning_of_a_clears_first_try():
    """A retry leaves max_tries as it was; a clear sets it to the try number plus the retries (Airflow's
    clear_task_instances), so the first try of the current clearing is max_tries - retries + 1."""
    from datetime import UTC, datetime
    from types import SimpleNamespace

    from lucid_airflow.operators import context_lineage

    run = SimpleNamespace(start_date=datetime(2026, 2, 1, tzinfo=UTC), clear_number=0)

    def lineage(try_number: int, max_tries: int) -> str:
        ti = SimpleNamespace(dag_id="d", task_id="t", run_id="r", map_index=-1, id=f"ti-{try_number}",
                             try_number=try_number, max_tries=max_tries, task=SimpleNamespace(retries=2))
        return context_lineage({"ti": ti, "dag_run": run})

    assert lineage(1, 2) == lineage(2, 2) == lineage(3, 2), "retries of one clearing share a lineage"
    assert lineage(4, 5) == lineage(5, 5) != lineage(3, 2), "a clear after try 3 starts a new one"


def test_a_retry_after_a_lost_worker_waits_for_the_job_the_lost_try_submitted(lucid_store, tmp_path, capfd,
                                                                               monkeypatch):
    """Try 1 submits its job and is lost before it can wait (here: its first status read fails as a dying
    worker's would). Try 2 finds that job still queued or running and waits for it: one job, run once."""
    from datetime import timedelta

    from lucid_airflow.hooks import LucidHook

    real, calls = LucidHook.get_job, []

    def get_job(self, job_id):
        calls.append(job_id)
        if len(calls) == 1:
            raise RuntimeError("worker lost")
        return real(self, job_id)

    monkeypatch.setattr(LucidHook, "get_job", get_job)
    dag = _example_dag()
    train = dag.task_dict["train"]
    train.poll_interval, train.retries, train.retry_delay = 1, 1, timedelta(0)
    with RoundLoop(lucid_store.url) as rounds:
        run = dag.test(run_conf=_conf(tmp_path, TRAIN_OK))
    assert not rounds.errors, rounds.errors
    train_ti = _tis(run)["train"]
    assert _state(train_ti.state) == "success" and train_ti.try_number == 2
    (job_id, job), = _jobs(lucid_store).items()
    assert job.state == "COMPLETED" and _xcom(run, "train") == job_id
    out = capfd.readouterr().out
    assert "worker lost" in out
    assert f"Lucid job {job_id}, submitted by an earlier try of this task, is" in out


def test_a_retry_waits_for_the_lost_trys_job_though_the_vc_it_defaulted_to_is_no_longer_the_only_one(
        airflow_db, lucid_home, tmp_path, capfd, monkeypatch):
    """With no `vc`, try 1 went to the fleet's only VC and its worker was lost; a second VC was added before try 2.
    The default was chosen before looking for try 1's job, so try 2 failed for good ("vc is needed") and left that
    job running with nothing to cancel it. The job is found first; the VC is chosen only to submit anew."""
    from datetime import timedelta

    from lucid_airflow.hooks import LucidHook

    from lucid_core.runtime.hosts.inventory import HostSpec, add_host
    from lucid_core.runtime.store.store import Store

    db = lucid_home / "lucid.db"
    monkeypatch.setenv("AIRFLOW_CONN_LUCID_DB", json.dumps({"conn_type": "sqlite", "host": str(db)}))
    store = Store(f"sqlite:///{db}")
    for name, pool in (("p0", "profiling"), ("m0", "main")):
        add_host(store, HostSpec(name, executor="local", pool=pool, vc="research", telemetry="emulated", gpus=1,
                                 workdir=str(tmp_path / name)))
    real, calls = LucidHook.get_job, []

    def get_job(self, job_id):
        calls.append(job_id)
        if len(calls) == 1:
            add_host(store, HostSpec("m1", executor="local", vc="other", telemetry="emulated", gpus=1,
                                     workdir=str(tmp_path / "m1")))
            raise RuntimeError("worker lost")
        return real(self, job_id)

    monkeypatch.setattr(LucidHook, "get_job", get_job)
    dag = _example_dag()
    train = dag.task_dict["train"]
    train.vc, train.poll_interval, train.retries, train.retry_delay = None, 1, 1, timedelta(0)
    with RoundLoop(store.url) as rounds:
        run = dag.test(run_conf=_conf(tmp_path, TRAIN_OK))
    assert not rounds.errors, rounds.errors
    train_ti = _tis(run)["train"]
    assert _state(train_ti.state) == "success" and train_ti.try_number == 2
    (job_id, job), = _jobs(store).items()
    assert (job.state, job.vc) == ("COMPLETED", "research")
    assert f"Lucid job {job_id}, submitted by an earlier try of this task, is" in capfd.readouterr().out
    store.dispose()


def test_trigger_serializes_reports_unknown_jobs_cancels_on_kill_and_fires_on_the_end(lucid_store):
    from lucid_airflow.triggers import LucidJobTrigger

    from lucid_core.runtime.surfaces.submission import JobRequest, submit

    trigger = LucidJobTrigger(job_id="j404", poll_interval=0.1)
    classpath, kwargs = trigger.serialize()
    assert classpath == "lucid_airflow.triggers.LucidJobTrigger"
    assert LucidJobTrigger(**kwargs).serialize() == (classpath, kwargs)

    async def first_event(t: LucidJobTrigger) -> dict:
        async for event in t.run():
            return event.payload
        raise AssertionError("the trigger ended without an event")

    missing = asyncio.run(first_event(trigger))
    assert missing["status"] == "error" and "no job 'j404'" in missing["message"]

    job = submit(lucid_store, JobRequest("sleep 30", gpus=1, user="ann", vc="default", name="killed"))
    watching = LucidJobTrigger(job_id=job, poll_interval=0.1)
    asyncio.run(watching.on_kill())  # the user marked the deferred task failed
    assert _jobs(lucid_store)[job].cancel_requested
    with RoundLoop(lucid_store.url) as rounds:
        event = asyncio.run(asyncio.wait_for(first_event(watching), timeout=60))
    assert not rounds.errors, rounds.errors
    assert event["status"] == "error" and event["state"] == "CANCELLED" and event["job_id"] == job
    assert event["message"] == f"Lucid job {job} CANCELLED: {_jobs(lucid_store)[job].end_reason}"
    assert not LucidJobTrigger(job_id=job, cancel_on_kill=False).serialize()[1]["cancel_on_kill"]


def test_a_triggerer_full_of_waits_keeps_no_store_connection_between_polls(airflow_db, empty_pg_url, monkeypatch):
    """Each deferred wait kept its own pooled PostgreSQL connection for as long as its job queued and ran: a
    sweep of 100 waits got "too many clients already" from the server (default max_connections 100) and starved
    the scheduling round. Waits now connect per poll: between polls none is held."""
    import sqlalchemy as sa
    from lucid_airflow.triggers import LucidJobTrigger

    from lucid_core.runtime.hosts.inventory import HostSpec, add_host
    from lucid_core.runtime.store.store import Store
    from lucid_core.runtime.surfaces.submission import JobRequest, submit

    pg_url = empty_pg_url
    monkeypatch.setenv("AIRFLOW_CONN_LUCID_DB", json.dumps({"extra": {"sqlalchemy_url": pg_url},
                                                             "conn_type": "generic"}))
    admin = sa.create_engine(pg_url, poolclass=sa.pool.NullPool)
    store = Store(pg_url)
    add_host(store, HostSpec("m9", executor="local", telemetry="emulated", gpus=1, workdir="/nonexistent/m9"))
    jobs = [submit(store, JobRequest("sleep 1", gpus=1, user="ann", vc="default", name=f"sweep-{k}"))
            for k in range(40)]
    store.dispose()
    database = sa.engine.make_url(pg_url).database

    def connections() -> int:
        with admin.connect() as conn:
            return conn.scalar(sa.text("SELECT count(*) FROM pg_stat_activity WHERE datname = :d "
                                       "AND pid <> pg_backend_pid()"), {"d": database})

    async def sweep() -> list[int]:
        async def wait(job: str) -> None:
            async for _event in LucidJobTrigger(job_id=job, poll_interval=0.2).run():
                return

        tasks = [asyncio.ensure_future(wait(job)) for job in jobs]
        samples = []
        try:
            for _ in range(10):  # two seconds of polls, five each
                await asyncio.sleep(0.2)
                samples.append(await asyncio.to_thread(connections))
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        return samples

    samples = asyncio.run(sweep())
    admin.dispose()
    assert max(samples) < len(jobs) // 2, samples  # kept: 40 from the first poll on


SENSOR_DAG = '''
from datetime import datetime

from airflow.sdk import DAG
from lucid_airflow.operators import LucidJobSensor

with DAG("lucid_sensor_check", schedule=None, start_date=datetime(2026, 1, 1), catchup=False):
    LucidJobSensor(task_id="wait", job_id="{{ params.job_id }}", poke_interval=1, params={"job_id": ""})
'''


def test_sensor_waits_in_the_triggerer_for_a_job_submitted_elsewhere(lucid_store, tmp_path):
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db
    from airflow.sdk.exceptions import AirflowException
    from lucid_airflow.operators import LucidJobSensor

    from lucid_core.runtime.surfaces.submission import JobRequest, submit

    (tmp_path / "sensor_dag.py").write_text(SENSOR_DAG)
    bag = DagBag(dag_folder=str(tmp_path / "sensor_dag.py"))
    assert not bag.import_errors, bag.import_errors
    DagBundlesManager().sync_bundles_to_db()
    sync_bag_to_db(bag, "dags-folder", None)
    # the job ends once the sensor has deferred (a job that ended before the first poke, on a loaded machine,
    # was seen done at once and never deferred)
    flag = tmp_path / "sensor_deferred"
    job = submit(lucid_store, JobRequest(f"while [ ! -e {flag} ]; do sleep 0.2; done", gpus=1, user="ann",
                                         vc="default", name="elsewhere"))
    released = threading.Event()

    def release_once_deferred() -> None:
        from airflow.models.taskinstance import TaskInstance
        from airflow.utils.session import create_session

        deadline = time.monotonic() + 120
        while not released.is_set() and time.monotonic() < deadline:
            with create_session() as session:
                if session.query(TaskInstance).filter(TaskInstance.dag_id == "lucid_sensor_check",
                                                      TaskInstance.trigger_id.is_not(None)).count():
                    break
            time.sleep(0.2)
        flag.touch()

    releaser = threading.Thread(target=release_once_deferred, daemon=True)
    releaser.start()
    with RoundLoop(lucid_store.url) as rounds:
        try:
            run = bag.dags["lucid_sensor_check"].test(run_conf={"job_id": job})
        finally:
            released.set()
            releaser.join()
        failing = submit(lucid_store, JobRequest("exit 2", gpus=1, user="ann", vc="default", name="bad"))
        deadline = time.monotonic() + 60
        while _jobs(lucid_store)[failing].state != "FAILED":
            assert time.monotonic() < deadline, _jobs(lucid_store)[failing].state
            time.sleep(0.3)
    assert not rounds.errors, rounds.errors
    (ti,) = run.get_task_instances()
    assert _state(ti.state) == "success" and ti.trigger_id is not None
    ended = _jobs(lucid_store)[job]
    assert ended.state == "COMPLETED" and ti.end_date.timestamp() >= ended.end_time
    with pytest.raises(AirflowException, match=f"Lucid job {failing} FAILED: .*code 2"):
        LucidJobSensor(task_id="direct", job_id=failing).poke({})


def test_hook_reads_the_store_url_from_sqlite_postgres_and_lucid_connections(tmp_path):
    from airflow.sdk import Connection
    from lucid_airflow.hooks import LucidHook

    assert LucidHook.default_conn_name == "lucid_db" and LucidHook.conn_name_attr == "lucid_conn_id"
    db = tmp_path / "x.db"
    assert LucidHook.url_from_connection(Connection(conn_id="a", conn_type="sqlite", host=str(db))) == f"sqlite:///{db}"
    fields = {"host": "db.internal", "port": 5432, "login": "u", "password": "p", "schema": "lucid"}
    expected = "postgresql+psycopg2://u:p@db.internal:5432/lucid"
    assert LucidHook.url_from_connection(Connection(conn_id="b", conn_type="postgres", **fields)) == expected
    assert LucidHook.url_from_connection(Connection(conn_id="c", conn_type="lucid", **fields)) == expected
    explicit = Connection(conn_id="d", conn_type="lucid", extra=json.dumps({"sqlalchemy_url": f"sqlite:///{db}"}))
    assert LucidHook.url_from_connection(explicit) == f"sqlite:///{db}"


def test_killing_the_waiting_task_cancels_its_job(lucid_store):
    from lucid_airflow.operators import LucidSubmitJobOperator

    from lucid_core.runtime.surfaces.submission import JobRequest, submit

    job = submit(lucid_store, JobRequest("sleep 30", gpus=1, user="ann", vc="default", name="train"))
    operator = LucidSubmitJobOperator(task_id="train", command="sleep 30", deferrable=False)
    operator.on_kill()  # killed before it submitted: nothing to cancel
    assert not _jobs(lucid_store)[job].cancel_requested
    operator.job_id = job  # as execute() records it once the job is submitted
    operator.on_kill()
    assert _jobs(lucid_store)[job].cancel_requested


def test_a_dag_run_made_again_with_the_same_run_id_submits_its_own_job(lucid_store, tmp_path):
    """A DAG run deleted and made again (same logical date, hence the same run_id: a re-run of a scheduled
    date, dag.test) is a new run: its first try submits a job of its own, it does not take over the old
    run's job and its outcome."""
    from datetime import UTC, datetime

    dag = _example_dag()
    dag.task_dict["train"].poll_interval = 1
    when = datetime(2026, 2, 1, tzinfo=UTC)
    with RoundLoop(lucid_store.url) as rounds:
        first = dag.test(run_after=when, logical_date=when, run_conf=_conf(tmp_path, "sleep 1; exit 3;"))
        second = dag.test(run_after=when, logical_date=when, run_conf=_conf(tmp_path, TRAIN_OK))
    assert not rounds.errors, rounds.errors
    assert first.run_id == second.run_id
    assert _state(first.state) == "failed"
    jobs = _jobs(lucid_store)
    assert len(jobs) == 2, "the new run reattached to the deleted run's job"
    assert sorted(j.state for j in jobs.values()) == ["COMPLETED", "FAILED"]
    assert _state(second.state) == "success"


def _flaky_status(monkeypatch, failing_calls: set[int], completed_from: int):
    """lucid_core's status query, failing as an unreachable store does on `failing_calls` (1-based) and
    reporting the job COMPLETED from call `completed_from` on."""
    from sqlalchemy.exc import OperationalError

    import lucid_core.runtime.surfaces.queries as queries

    real, calls = getattr(queries.status, "__wrapped__", queries.status), []

    def status(store, job_id):
        calls.append(job_id)
        if len(calls) in failing_calls:
            raise OperationalError("SELECT", {}, ConnectionRefusedError("connection refused"))
        info = real(store, job_id)
        return {**info, "state": "COMPLETED", "exit_code": 0} if len(calls) >= completed_from else info

    status.__wrapped__ = real  # patched again, the next one wraps the real query, not this one
    monkeypatch.setattr(queries, "status", status)
    return calls


def test_a_store_blip_does_not_end_the_wait_while_the_job_runs_on(lucid_store, monkeypatch):
    """A store restart during the wait (a failed read or two) must not fail the task: its job runs on, and
    the retry would submit a second one. Only a store unreachable past `store_outage_s` ends the wait."""
    from lucid_airflow.hooks import LucidHook
    from lucid_airflow.triggers import LucidJobTrigger

    from lucid_core.runtime.surfaces.submission import JobRequest, submit

    job = submit(lucid_store, JobRequest("sleep 30", gpus=1, user="ann", vc="default", name="train"))

    async def first_event(t: LucidJobTrigger) -> dict:
        async for event in t.run():
            return event.payload
        raise AssertionError("the trigger ended without an event")

    calls = _flaky_status(monkeypatch, {2, 3}, completed_from=5)
    event = asyncio.run(asyncio.wait_for(first_event(LucidJobTrigger(job_id=job, poll_interval=0.05)), 30))
    assert event["status"] == "success" and event["state"] == "COMPLETED" and len(calls) == 5
    assert LucidJobTrigger(job_id=job, store_outage_s=5).serialize()[1]["store_outage_s"] == 5

    _flaky_status(monkeypatch, set(range(2, 1000)), completed_from=1000)
    gone = LucidJobTrigger(job_id=job, poll_interval=0.05, store_outage_s=0.3)
    event = asyncio.run(asyncio.wait_for(first_event(gone), 30))
    assert event["status"] == "error" and event["state"] is None and "connection refused" in event["message"]

    calls = _flaky_status(monkeypatch, {1, 2}, completed_from=3)
    hook = LucidHook()
    try:
        assert hook.wait_for_job(job, poll_interval=0.05)["state"] == "COMPLETED" and len(calls) == 3
    finally:
        hook.close()


@pytest.mark.parametrize("deferrable", [True, False], ids=["deferred", "polling-in-worker"])
def test_a_job_cancelled_outside_airflow_fails_the_task_without_a_retry(lucid_store, tmp_path, deferrable):
    """Someone cancelled the job in Lucid (the CLI, the web page) to free its GPUs: the task fails for good,
    its retries do not submit the job again."""
    from datetime import timedelta

    from lucid_core.runtime.surfaces.submission import cancel

    dag = _example_dag()
    train = dag.task_dict["train"]
    train.poll_interval, train.deferrable, train.retries, train.retry_delay = 1, deferrable, 2, timedelta(0)

    def cancel_the_first_job() -> None:
        deadline = time.monotonic() + 60
        while not _jobs(lucid_store) and time.monotonic() < deadline:
            time.sleep(0.2)
        for job_id in _jobs(lucid_store):
            cancel(lucid_store, job_id)

    canceller = threading.Thread(target=cancel_the_first_job, daemon=True)
    with RoundLoop(lucid_store.url) as rounds:
        canceller.start()
        run = dag.test(run_conf=_conf(tmp_path, "sleep 60;"))
        canceller.join(timeout=60)
    assert not rounds.errors, rounds.errors
    assert _state(_tis(run)["train"].state) == "failed"
    jobs = _jobs(lucid_store)
    assert [j.state for j in jobs.values()] == ["CANCELLED"], "a retry submitted the cancelled job again"
    assert _tis(run)["train"].try_number == 1


SWEEP_DAG = '''
from datetime import datetime

from airflow.sdk import DAG, task
from lucid_airflow.operators import LucidSubmitJobOperator

with DAG("lucid_sweep_check", schedule=None, start_date=datetime(2026, 1, 1), catchup=False,
         params={"gpus": 2, "hours": 0.5}):
    @task
    def prepare() -> dict:
        return {"DATA": "/data/shard-7"}

    LucidSubmitJobOperator.partial(task_id="train", user="ann", env=prepare(), gpus="{{ params.gpus }}",
                                   time_limit="{{ params.hours * 3600 }}", wait_for_completion=False).expand(
        command=["python train.py --lr 0.1", "python train.py --lr 0.01"])
'''


def test_a_mapped_sweep_takes_env_from_a_task_gpus_from_the_form_and_names_each_job(airflow_db, lucid_home,
                                                                                       tmp_path, monkeypatch):
    """A team's sweep as Airflow users write it: `env=` an upstream task's output broke the DAG's import
    ('XComArg' object is not iterable), `gpus="{{ params.gpus }}"` was refused as text, every job of the sweep
    had the same name, and a fleet whose one VC is not `default` refused every job."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.dagbag import DagBag, sync_bag_to_db

    from lucid_core.runtime.hosts.inventory import HostSpec, add_host
    from lucid_core.runtime.store.store import Store

    db = lucid_home / "lucid.db"
    monkeypatch.setenv("AIRFLOW_CONN_LUCID_DB", json.dumps({"conn_type": "sqlite", "host": str(db)}))
    store = Store(f"sqlite:///{db}")
    add_host(store, HostSpec("m0", executor="local", vc="research", telemetry="emulated", gpus=2,
                             workdir=str(tmp_path / "m0")))
    (tmp_path / "sweep_dag.py").write_text(SWEEP_DAG)
    bag = DagBag(dag_folder=str(tmp_path / "sweep_dag.py"))
    assert not bag.import_errors, bag.import_errors
    DagBundlesManager().sync_bundles_to_db()
    sync_bag_to_db(bag, "dags-folder", None)
    run = bag.dags["lucid_sweep_check"].test()
    assert _state(run.state) == "success"
    jobs = sorted(_jobs(store).values(), key=lambda job: job.name)
    assert [(j.name, j.gpus, j.vc, j.env, j.time_limit_s) for j in jobs] == [
        (f"lucid_sweep_check.train[{k}]", 2, "research", {"DATA": "/data/shard-7"}, 1800.0) for k in (0, 1)]
    assert {j.command for j in jobs} == {"python train.py --lr 0.1", "python train.py --lr 0.01"}
    store.dispose()
