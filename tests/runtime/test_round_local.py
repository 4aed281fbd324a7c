"""The round with the local executor on both store backends; explain, eta, HTTP API and CLI."""

from __future__ import annotations

import json
import time

import pytest
from duration_stubs import FixedDurations
from fastapi import HTTPException, Request
from fastapi.testclient import TestClient
from runtime_helpers import SETTINGS, fast_config, jobs_by_id

from lucid_core.runtime.hosts.inventory import HostSpec, add_host
from lucid_core.runtime.hosts.local_executor import local_executor
from lucid_core.runtime.round.scheduling_round import SchedulingRound
from lucid_core.runtime.surfaces.api import create_app
from lucid_core.runtime.surfaces.eta import estimate
from lucid_core.runtime.surfaces.explain import explain
from lucid_core.runtime.surfaces.queries import queue
from lucid_core.runtime.surfaces.submission import JobRequest, submit


def _local_cluster(store, root, main_gpus=1):
    add_host(store, HostSpec("p0", executor="local", pool="profiling", vc="vc-a", telemetry="emulated", gpus=1,
                             workdir=str(root / "p0")))
    add_host(store, HostSpec("m0", executor="local", vc="vc-a", telemetry="emulated", gpus=main_gpus,
                             workdir=str(root / "m0")))


def _round(store, config=None, **kw):
    return SchedulingRound(store, local_executor(), config or fast_config(), SETTINGS, **kw).run()


def _until(store, done, timeout_s=20.0, config=None, **kw):
    deadline = time.monotonic() + timeout_s
    while True:
        _round(store, config, **kw)
        jobs = jobs_by_id(store)
        if done(jobs):
            return jobs
        assert time.monotonic() < deadline, {j: (r.state, r.pending_reason) for j, r in jobs.items()}
        time.sleep(0.25)


def test_round_profiles_places_and_explains_on_each_backend(store, tmp_path):
    _local_cluster(store, tmp_path)
    jumbo = lambda job: (97.0, 60.0, 20000.0)  # noqa: E731 - heavy: Jumbo, never shares
    a = submit(store, JobRequest("sleep 20", 1, "ann", "vc-a", name="big-a"))
    b = submit(store, JobRequest("sleep 20", 1, "ann", "vc-a", name="big-b"))
    jobs = _until(store, lambda j: j[a].state == "RUNNING" and j[b].state == "QUEUED", emulated_profile=jumbo)
    assert jobs[a].share_class == 2
    rows = {r["job_id"]: r for r in queue(store)}
    assert rows[b]["position"] == 1 and "no compact fit for 1 GPU(s)" in rows[b]["pending_reason"]
    info = explain(store, b, fast_config(), time.time())
    assert info["packing"]["class"] == "JUMBO" and info["packing"]["path"][-1].endswith("-> Jumbo")
    assert info["priority"]["predicted_duration_s"] > 0 and info["priority"]["duration"]["terms"]
    assert "no compact fit" in info["pending"]["reason"]
    assert info["ordered_by"]["rule"] == "priority" and "less predicted GPU-time go first" in info["ordered_by"]["why"]
    assert [d["kind"] for d in info["decisions"]] == ["StartProfiling", "StopProfiling"]
    eta = estimate(store, b, fast_config(), time.time())
    running_a = estimate(store, a, fast_config(), time.time())
    assert running_a.end is not None and eta.start is not None
    assert eta.start == pytest.approx(running_a.end, abs=1.0)  # b starts when a is predicted to end
    from lucid_core.runtime.surfaces.submission import cancel

    cancel(store, a)
    cancel(store, b)
    jobs = _until(store, lambda j: j[a].state == j[b].state == "CANCELLED")


def test_two_rounds_never_decide_at_once(store, tmp_path):
    from lucid_core.runtime.store import lease
    _local_cluster(store, tmp_path)
    assert lease.acquire(store, "someone-else", ttl_s=30, now=time.time())
    report = _round(store)
    assert report.acquired is False and report.round_id is None


@pytest.fixture
def api_store(tmp_path):
    from lucid_core.runtime.store.store import Store

    store = Store(f"sqlite:///{tmp_path / 'api.db'}")
    _local_cluster(store, tmp_path, main_gpus=2)
    yield store
    store.dispose()


def test_http_api_submit_queue_job_cancel_and_auth(api_store):
    def auth(request: Request) -> None:
        if request.headers.get("authorization") != "Bearer ok":
            raise HTTPException(status_code=401, detail="not authenticated")

    app = create_app(str(api_store.url), store=api_store, config=fast_config(), auth=auth)
    client = TestClient(app)
    body = {"command": "sleep 1", "gpus": 1, "user": "ann", "vc": "vc-a"}
    assert client.post("/jobs", json=body).status_code == 401
    headers = {"authorization": "Bearer ok"}
    bad = client.post("/jobs", json={**body, "gpus": 3, "vc": "nope"}, headers=headers)
    assert bad.status_code == 422 and set(bad.json()["errors"]) == {"vc"}
    bad = client.post("/jobs", json={**body, "gpus": "many"}, headers=headers)
    assert bad.status_code == 422 and "gpus" in json.dumps(bad.json())
    made = client.post("/jobs", json=body, headers=headers)
    assert made.status_code == 201
    job = made.json()["job_id"]
    assert [r["job_id"] for r in client.get("/queue", headers=headers).json()] == [job]
    assert client.get(f"/jobs/{job}", headers=headers).json()["state"] == "SUBMITTED"
    assert client.get("/jobs/j404", headers=headers).status_code == 404
    assert client.get(f"/jobs/{job}/explain", headers=headers).json()["job_id"] == job
    assert client.get(f"/jobs/{job}/eta", headers=headers).json()["job_id"] == job
    assert {h["name"] for h in client.get("/hosts", headers=headers).json()} == {"p0", "m0"}
    assert client.post(f"/jobs/{job}/cancel", headers=headers).json()["cancel_requested"] is True


def test_cli_submit_round_status_and_logs(tmp_path, capsys, monkeypatch):
    import argparse

    from lucid_core.runtime.surfaces.cli.commands import add_parser

    parser = argparse.ArgumentParser(prog="lucid")
    add_parser(parser.add_subparsers(dest="cmd", required=True))
    url = f"sqlite:///{tmp_path / 'cli.db'}"

    def run(*argv):
        args = parser.parse_args(list(argv))
        return args.func(args)

    for host, pool in (("p0", "profiling"), ("m0", "main")):
        assert run("hosts", "add", host, "--store", url, "--executor", "local", "--pool", pool, "--vc", "vc-a",
                   "--gpus", "1", "--telemetry", "emulated", "--workdir", str(tmp_path / host)) == 0
    capsys.readouterr()
    assert run("submit", "--store", url, "--gpus", "2", "--vc", "vc-a", "--", "true") == 2
    assert "gpus: 2 GPUs is more than any VC has" in capsys.readouterr().err
    assert run("submit", "--store", url, "--gpus", "1", "--vc", "vc-a", "--", "echo", "hello world") == 0
    job = capsys.readouterr().out.strip()
    monkeypatch.setenv("LUCID__PROFILER__TPROF_S", "2")
    for _ in range(20):
        assert run("round", "--store", url, "--stop-grace", "1") == 0
        capsys.readouterr()
        run("status", "--store", url, "--json", job)
        if json.loads(capsys.readouterr().out)["state"] == "COMPLETED":
            break
        time.sleep(0.25)
    run("logs", "--store", url, job)
    assert capsys.readouterr().out == "hello world\n"
    assert run("queue", "--store", url) == 0 and job not in capsys.readouterr().out


def _NamedPredictions(by_name: dict[str, float]) -> FixedDurations:
    """Predicts from the job's name (the test decides which job looks long and which short)."""
    return FixedDurations(by_name, key=lambda job: job.name)


def test_a_preemptible_job_past_its_prediction_yields_live_and_runs_again(store, tmp_path):
    """Yielding in the live round: a preemptible job predicted at 1 s runs on; a short job arrives and
    takes its GPU (the long one's run is stopped with reason 'preempt', the job waits again and is
    relaunched after); a job that did not say it resumes from checkpoints is never stopped."""
    from runtime_helpers import runs_of

    from lucid_core.policy.lucid import LucidPolicy

    _local_cluster(store, tmp_path)
    config = fast_config(**{"profiler.enabled": False, "binder.sharing": "off", "tiresias.checkpoint_cost_s": 0.1,
                            "orchestrator.yield_interval_s": 0,
                            "orchestrator.yield_min_run": 1})
    factory = lambda cfg, snapshot: LucidPolicy(  # noqa: E731
        cfg, duration_model=_NamedPredictions({"long": 1.0, "pinned": 1.0, "short": 0.5}))
    pinned = submit(store, JobRequest("sleep 60", 1, "ann", "vc-a", name="pinned"))
    _until(store, lambda j: j[pinned].state == "RUNNING", config=config, policy_factory=factory)
    time.sleep(3)
    blocked = submit(store, JobRequest("sleep 1", 1, "ann", "vc-a", name="short"))
    for _ in range(4):
        _round(store, config, policy_factory=factory)
        time.sleep(0.25)
    jobs = jobs_by_id(store)
    assert jobs[pinned].state == "RUNNING" and jobs[blocked].state == "QUEUED"  # not preemptible: never stopped
    from lucid_core.runtime.surfaces.submission import cancel

    cancel(store, pinned)
    _until(store, lambda j: j[pinned].state == "CANCELLED" and j[blocked].state == "COMPLETED",
           config=config, policy_factory=factory)

    long = submit(store, JobRequest("sleep 60", 1, "ann", "vc-a", name="long", preemptible=True))
    _until(store, lambda j: j[long].state == "RUNNING", config=config, policy_factory=factory)
    time.sleep(3)  # past 4 x the short job's 0.5 s: it has outlived its 1 s prediction by far
    short = submit(store, JobRequest("sleep 1", 1, "ann", "vc-a", name="short"))
    jobs = _until(store, lambda j: j[short].state == "COMPLETED" and j[long].state == "RUNNING",
                  config=config, policy_factory=factory)
    assert jobs[long].yields == 1
    runs = runs_of(store, long)
    assert len(runs) == 2 and runs[0].stop_reason == "preempt" and runs[0].state == "ended"
    taker = runs_of(store, short)[0]
    assert runs[1].state == "running" and taker.started_at >= runs[0].ended_at  # it ran once the GPU was free
    from sqlalchemy import select

    from lucid_core.runtime.store.schema import DecisionRow
    with store.session() as s:
        placed = s.scalars(select(DecisionRow.reason).where(DecisionRow.job_id == short,
                                                            DecisionRow.kind == "Place")).all()
    assert placed and "took the GPUs of " + long in placed[0]
    cancel(store, long)
    _until(store, lambda j: j[long].state == "CANCELLED", config=config, policy_factory=factory)


#: a training job that checkpoints to the path it is given (outside its run's working directory), resumes from
#: it, and on SIGTERM finishes the step it is in and exits: what a `--preemptible` job promises
CHECKPOINTING_JOB = """
import os, signal, sys, time
ckpt_dir, steps, gate = sys.argv[1], int(sys.argv[2]), sys.argv[3]
stopping = []
signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
os.makedirs(ckpt_dir, exist_ok=True)
ckpt = os.path.join(ckpt_dir, "step")
done = int(open(ckpt).read()) if os.path.exists(ckpt) else 0
with open(os.path.join(ckpt_dir, "runs"), "a") as log:
    log.write(f"{os.environ['LUCID_WORKDIR']} {done}\\n")
while done < steps:
    if stopping:
        sys.exit(143)
    if done >= steps // 2 and not os.path.exists(gate):  # its second half waits for the test's word
        time.sleep(0.05)
        continue
    time.sleep(0.2)
    done += 1
    with open(os.path.join(ckpt_dir, "work"), "a") as log:
        log.write(f"{done}\\n")
    with open(ckpt + ".tmp", "w") as out:
        out.write(str(done))
    os.replace(ckpt + ".tmp", ckpt)
"""


def test_a_job_that_yields_resumes_from_its_checkpoint_and_does_its_work_once(store, tmp_path):
    """The README's contract for `--preemptible`: checkpoints go to a path the job names, not under its working
    directory, since the next run starts in a fresh one. A real process is yielded by a real round (a short job
    takes its GPU), runs again, resumes where its checkpoint says and does each step once. Its second half waits
    for a gate opened once the short job is done: on a loaded machine it had finished before a round could yield it."""
    import sys

    from runtime_helpers import runs_of

    from lucid_core.policy.lucid import LucidPolicy

    _local_cluster(store, tmp_path)
    config = fast_config(**{"profiler.enabled": False, "binder.sharing": "off", "tiresias.checkpoint_cost_s": 0.1,
                            "orchestrator.yield_interval_s": 0, "orchestrator.yield_min_run": 1})
    factory = lambda cfg, snapshot: LucidPolicy(  # noqa: E731
        cfg, duration_model=_NamedPredictions({"train": 1.0, "short": 0.5}))
    script, ckpt, steps, gate = tmp_path / "train.py", tmp_path / "shared" / "ckpt", 30, tmp_path / "gate"
    script.write_text(CHECKPOINTING_JOB)
    train = submit(store, JobRequest(f"{sys.executable} {script} {ckpt} {steps} {gate}", 1, "ann", "vc-a",
                                     name="train", preemptible=True))
    _until(store, lambda j: j[train].state == "RUNNING", config=config, policy_factory=factory)
    time.sleep(2)  # some steps done, and far past its 1 s prediction: a short job may take its GPU
    short = submit(store, JobRequest("sleep 1", 1, "ann", "vc-a", name="short"))
    _until(store, lambda j: j[short].state == "COMPLETED", timeout_s=60, config=config, policy_factory=factory)
    gate.touch()
    jobs = _until(store, lambda j: j[train].state == "COMPLETED", timeout_s=60, config=config,
                  policy_factory=factory)
    assert jobs[train].yields == 1
    runs = runs_of(store, train)
    assert len(runs) == 2 and runs[0].stop_reason == "preempt"
    started = [line.split() for line in (ckpt / "runs").read_text().splitlines()]
    assert len(started) == 2 and started[0][1] == "0" and int(started[1][1]) > 0  # the second run resumed
    assert started[0][0] != started[1][0]  # in a fresh working directory: the checkpoint was outside it
    assert (ckpt / "work").read_text().split() == [str(k) for k in range(1, steps + 1)]  # every step once


def test_queued_jobs_keep_their_class_and_prediction_until_the_models_change(store, tmp_path):
    """Issue 14: a steady round predicts only what is new. Queued jobs come back with the class and
    prediction stored by the round before (jobs.predicted_by names the models), also when a job finishes
    (as a simulated job keeps the prediction it was queued with); a promoted model has them predicted again."""
    from sqlalchemy import update

    from lucid_core.policy.lucid import LucidPolicy
    from lucid_core.runtime.store.schema import JobRow

    add_host(store, HostSpec("m0", executor="local", vc="vc-b", telemetry="emulated", gpus=1,
                             workdir=str(tmp_path / "m0")))  # another VC's host: vc-a's jobs stay queued
    now = time.time()
    with store.session() as s:
        for i in range(5):
            s.add(JobRow(job_id=f"q{i}", seq=i + 1, name=f"n{i}", user="ann", vc="vc-a", gpus=1, command="true",
                         env={}, state="QUEUED", submit_time=now - 100 + i, profiled=True, gpu_util=50.0,
                         mem_util=20.0, gpu_mem_mb=2000.0, known_min_duration=200.0))
    model = FixedDurations({f"q{i}": 600.0 + 10 * i for i in range(5)})
    version = ["v1"]

    def factory(cfg, snapshot):
        policy = LucidPolicy(cfg, duration_model=model)
        policy.model_sources = {"duration": f"counting model {version[0]}"}
        return policy

    config = fast_config(**{"profiler.enabled": False})
    _round(store, config, policy_factory=factory)
    assert model.asked == [5]
    first = jobs_by_id(store)
    assert all(first[f"q{i}"].predicted_by and first[f"q{i}"].predicted_duration for i in range(5))
    _round(store, config, policy_factory=factory)
    _round(store, config, policy_factory=factory)
    assert model.asked == [5]  # nothing changed: nothing predicted again
    again = jobs_by_id(store)
    assert [again[f"q{i}"].queue_position for i in range(5)] == [first[f"q{i}"].queue_position for i in range(5)]
    assert all(again[f"q{i}"].predicted_duration == first[f"q{i}"].predicted_duration for i in range(5))
    with store.session() as s:  # a job finishes: the history moved on, the models did not
        s.execute(update(JobRow).where(JobRow.job_id == "q4").values(state="COMPLETED", start_time=now - 50,
                                                                        end_time=now - 10))
    _round(store, config, policy_factory=factory)
    assert model.asked == [5]
    version[0] = "v2"  # a promotion: every queued job is predicted by the new model
    _round(store, config, policy_factory=factory)
    assert model.asked == [5, 4]
    _round(store, config, policy_factory=factory)
    assert model.asked == [5, 4]


def test_the_history_fallback_predicts_queued_jobs_again_as_its_history_doubles(store, tmp_path):
    """Without a promoted model the round's fallback learns from the store's finished jobs. A queued job is
    predicted again when that history has doubled since (1, 2, 4, ... jobs), not on every job that ends."""
    from lucid_core.runtime.store.schema import JobRow

    add_host(store, HostSpec("m0", executor="local", vc="vc-b", telemetry="emulated", gpus=1,
                             workdir=str(tmp_path / "m0")))  # another VC's host: vc-a's job stays queued
    now = time.time()

    finished: list[str] = []

    def finish(n: int) -> None:
        with store.session() as s:
            for _ in range(n):
                k = len(finished)
                finished.append(f"h{k}")
                s.add(JobRow(job_id=f"h{k}", seq=100 + k, name="h", user="ann", vc="vc-a", gpus=1, command="true",
                             env={}, state="COMPLETED", submit_time=now - 900, start_time=now - 800,
                             end_time=now - 800 + 60 * (k + 1)))

    with store.session() as s:
        s.add(JobRow(job_id="q", seq=1, name="q", user="ann", vc="vc-a", gpus=1, command="true", env={},
                     state="QUEUED", submit_time=now - 100, profiled=True, gpu_util=50.0, mem_util=20.0,
                     gpu_mem_mb=2000.0, known_min_duration=0.0))
    config = fast_config(**{"profiler.enabled": False})
    seen = []
    for added in (0, 0, 1, 1, 1, 1, 4):  # history 0, 0, 1, 2, 3, 4, 8
        finish(added)
        _round(store, config)
        row = jobs_by_id(store)["q"]
        seen.append((row.predicted_by, row.predicted_duration))
    keys = [key for key, _ in seen]
    assert keys[0] == keys[1] and keys[3] == keys[4]  # same history, or not yet doubled: kept
    assert len({keys[0], keys[2], keys[3], keys[5], keys[6]}) == 5  # 0 -> 1 -> 2 -> 4 -> 8: predicted again
    assert seen[0][1] == 3600.0 and seen[2][1] == pytest.approx(60.0)  # no history: the default hour; then its one job
    assert seen[4][1] == seen[3][1]  # the third job did not double the history: the prediction stayed


def test_a_stored_row_gone_bad_costs_that_job_alone(store, tmp_path):
    """Whatever another controller or a hand edit writes into a job's row is untrusted. A stored class that
    names no class, or a negative or NaN prediction, is dropped and learned again. A running job whose state
    is none of ours keeps its GPU. A row that cannot be read at all (text in a number column, which SQLite
    stores) leaves that job out of the round with an error naming it. The round goes on for every other job."""
    from sqlalchemy import text

    from lucid_core.policy.lucid import LucidPolicy
    from lucid_core.runtime.store.schema import JobRow

    add_host(store, HostSpec("m0", executor="local", vc="vc-a", telemetry="emulated", gpus=1,
                             workdir=str(tmp_path / "m0")))
    config = fast_config(**{"profiler.enabled": False, "binder.sharing": "off"})
    durations = {"hold": 600.0, "a": 30.0, "b": 60.0, "c": 90.0, "d": 120.0}

    def factory(cfg, snapshot):
        policy = LucidPolicy(cfg, duration_model=FixedDurations(durations, key=lambda job: job.name))
        policy.model_sources = {"duration": "fixed"}
        return policy

    hold = submit(store, JobRequest("sleep 4", 1, "ann", "vc-a", name="hold"))
    _until(store, lambda jobs: jobs[hold].state == "RUNNING", config=config, policy_factory=factory)
    ids = {n: submit(store, JobRequest("true", 1, "ann", "vc-a", name=n)) for n in "abcd"}
    _round(store, config, policy_factory=factory)
    sqlite = store.engine.dialect.name == "sqlite"
    with store.session() as s:
        s.get(JobRow, ids["a"]).share_class = 99
        s.get(JobRow, ids["b"]).predicted_duration = -5e9
        s.get(JobRow, ids["c"]).predicted_duration = float("nan")
        s.get(JobRow, hold).state = "BOGUS"
        if sqlite:
            s.execute(text("UPDATE jobs SET gpu_util = 'abc', profiled = 1 WHERE job_id = :j"), {"j": ids["d"]})
    report = _round(store, config, policy_factory=factory)
    assert not any("refused" in e for e in report.errors), report.errors  # nothing planned on the held GPU
    if sqlite:
        assert any(ids["d"] in e and "cannot be read" in e for e in report.errors), report.errors
    jobs = jobs_by_id(store)
    assert all(jobs[i].state == "QUEUED" for i in ids.values()), "a job started on the GPU the running job holds"
    assert jobs[ids["b"]].predicted_duration == 60.0  # predicted again, not left at -5e9
    with store.session() as s:  # mended: the next rounds settle the running job and run the rest
        s.get(JobRow, hold).state = "RUNNING"
        s.execute(text("UPDATE jobs SET gpu_util = NULL, profiled = :f WHERE job_id = :j"), {"j": ids["d"], "f": False})
    jobs = _until(store, lambda jobs: all(jobs[i].state == "COMPLETED" for i in (hold, *ids.values())),
                  config=config, policy_factory=factory)
    assert [jobs[ids[n]].state for n in "abcd"] == ["COMPLETED"] * 4


def test_the_cycle_collector_is_off_for_the_whole_round_and_back_on_after_it(store, tmp_path, monkeypatch):
    import gc

    _local_cluster(store, tmp_path)
    submit(store, JobRequest("sleep 5", 1, "ann", "vc-a", name="gc-a"))
    seen: dict[str, bool] = {}
    real_reconcile, real_execute = SchedulingRound.reconcile, SchedulingRound.execute

    def reconcile(self):
        seen["reconcile"] = gc.isenabled()  # polls run before decide's own pause
        return real_reconcile(self)

    def execute(self):
        seen["execute"] = gc.isenabled()  # launches run after it: decide's pause must not turn it back on
        return real_execute(self)

    monkeypatch.setattr(SchedulingRound, "reconcile", reconcile)
    monkeypatch.setattr(SchedulingRound, "execute", execute)
    assert gc.isenabled()
    _round(store)
    assert seen == {"reconcile": False, "execute": False} and gc.isenabled()

    def broken(self):
        raise RuntimeError("step failed")

    monkeypatch.setattr(SchedulingRound, "reconcile", broken)
    with pytest.raises(RuntimeError, match="step failed"):
        _round(store)
    assert gc.isenabled()  # a failed step does not leave the process without its collector


def test_a_stored_known_run_time_gone_bad_is_dropped(store, tmp_path):
    """What a job is known to have run already (`known_min_duration`) floors its prediction. Written as infinity
    by another controller or a hand edit, it would predict the job to run for ever (never overdue, last of its
    class); NaN or negative, it means nothing. Read back, such a value counts as nothing known."""
    import math

    from lucid_core.policy.lucid import LucidPolicy
    from lucid_core.runtime.store.schema import JobRow

    add_host(store, HostSpec("m0", executor="local", vc="vc-a", telemetry="emulated", gpus=1,
                             workdir=str(tmp_path / "m0")))
    config = fast_config(**{"profiler.enabled": False, "binder.sharing": "off"})
    durations = {"hold": 600.0, "a": 30.0, "b": 60.0, "c": 90.0}

    def factory(cfg, snapshot):
        policy = LucidPolicy(cfg, duration_model=FixedDurations(durations, key=lambda job: job.name))
        policy.model_sources = {"duration": "fixed"}
        return policy

    hold = submit(store, JobRequest("sleep 3", 1, "ann", "vc-a", name="hold"))
    _until(store, lambda jobs: jobs[hold].state == "RUNNING", config=config, policy_factory=factory)
    ids = {n: submit(store, JobRequest("true", 1, "ann", "vc-a", name=n)) for n in "abc"}
    bad = (math.inf, math.nan if store.engine.dialect.name != "sqlite" else -math.inf, -1e9)  # SQLite keeps no NaN
    with store.session() as s:
        for name, value in zip("abc", bad, strict=True):
            s.get(JobRow, ids[name]).known_min_duration = value
    _round(store, config, policy_factory=factory)
    jobs = jobs_by_id(store)
    assert [jobs[ids[n]].predicted_duration for n in "abc"] == [30.0, 60.0, 90.0]
    jobs = _until(store, lambda jobs: all(jobs[i].state == "COMPLETED" for i in (hold, *ids.values())),
                  config=config, policy_factory=factory)
    assert [jobs[ids[n]].state for n in "abc"] == ["COMPLETED"] * 3


def test_a_job_read_as_ended_rounds_later_ends_when_it_ended(store, tmp_path):
    """A round reads an end up to its interval late: the job's end time (its history's elapsed time, and the
    durations the models learn) and its run's are when the job exited on its host, not when a round saw it."""
    _local_cluster(store, tmp_path)
    config = fast_config(**{"profiler.enabled": False})
    job = submit(store, JobRequest("sleep 1", 1, "ann", "vc-a", name="short"))
    started = _until(store, lambda js: js[job].state == "RUNNING", config=config)[job].start_time
    time.sleep(6.0)  # the job ended about 5 s before the next round reads it
    read_at = time.time()
    row = _until(store, lambda js: js[job].state == "COMPLETED", config=config)[job]
    assert started + 0.5 <= row.end_time <= started + 3.5, (row.end_time - started, read_at - started)
    from sqlalchemy import select

    from lucid_core.runtime.store.schema import RunRow

    with store.session() as s:
        run = s.scalars(select(RunRow).where(RunRow.job_id == job)).one()
    assert run.ended_at == row.end_time and run.ended_at < read_at - 2


@pytest.mark.parametrize(("before", "after"), [(3.0, 30.0), (30.0, 3.0)])
def test_a_changed_profiling_window_applies_from_the_next_round(store, tmp_path, before, after):
    """The window a round saved with the store's policy state gave way to a changed `profiler.tprof_s` only at
    the next mode check (10 minutes by default): `lucid round --set profiler.tprof_s=30` still profiled for
    the window an earlier round had used."""
    from sqlalchemy import select

    from lucid_core.runtime.store.schema import DecisionRow

    add_host(store, HostSpec("p0", executor="local", pool="profiling", vc="vc-a", telemetry="emulated", gpus=2,
                             workdir=str(tmp_path / "p0")))
    add_host(store, HostSpec("m0", executor="local", vc="vc-a", telemetry="emulated", gpus=1,
                             workdir=str(tmp_path / "m0")))
    first = submit(store, JobRequest("sleep 60", 1, "ann", "vc-a", name="first"))
    _round(store, fast_config(**{"profiler.tprof_s": before, "profiler.in_place": False}))
    second = submit(store, JobRequest("sleep 60", 1, "ann", "vc-a", name="second"))
    _round(store, fast_config(**{"profiler.tprof_s": after, "profiler.in_place": False}))
    with store.session() as s:
        said = {d.job_id: d.reason for d in s.scalars(select(DecisionRow).where(DecisionRow.kind == "StartProfiling"))}
    assert f"window {before:g} s" in said[first] and f"window {after:g} s" in said[second], said
    from lucid_core.runtime.surfaces.submission import cancel

    for job_id in (first, second):
        cancel(store, job_id)
    _until(store, lambda js: all(js[j].state == "CANCELLED" for j in (first, second)),
           config=fast_config(**{"profiler.tprof_s": after, "profiler.in_place": False}))


def _exit_record(tmp_path, store, job_id: str) -> None:
    """Wait until every run of the job has written its exit record on its host."""
    from runtime_helpers import runs_of

    deadline = time.monotonic() + 30
    for run in runs_of(store, job_id):
        while not (tmp_path / run.host / run.run_id / "exit_code").exists():
            assert time.monotonic() < deadline
            time.sleep(0.05)


def test_a_job_that_outlived_its_window_and_ended_between_rounds_keeps_its_profile(store, tmp_path):
    """Its end is dated before the round that reads it: the runs that round ended are read for their windows
    all the same (they were found by an end time within the round, and were lost: no profile, and marked as
    ended inside its window)."""
    _local_cluster(store, tmp_path)
    config = fast_config(**{"profiler.tprof_s": 1.0})
    job = submit(store, JobRequest("sleep 4", 1, "alice", "vc-a", name="ends-unread"))
    _until(store, lambda js: js[job].state == "PROFILING", config=config)
    _exit_record(tmp_path, store, job)
    time.sleep(2.0)  # the round reads the end 2 s late
    _round(store, config)
    row = jobs_by_id(store)[job]
    assert row.state == "COMPLETED" and row.profiled and not row.ended_in_profiling, (row.state, row.profiled)


def test_a_wide_job_ends_with_its_last_node_whatever_order_they_are_read_in(store, tmp_path):
    for name in ("m0", "m1"):
        add_host(store, HostSpec(name, executor="local", vc="vc-a", telemetry="emulated", gpus=1,
                                 workdir=str(tmp_path / name)))
    config = fast_config(**{"profiler.enabled": False})
    job = submit(store, JobRequest('case "$LUCID_WORKDIR" in */m0/*) sleep 4 ;; *) sleep 1 ;; esac', 2, "ann",
                                   "vc-a", name="wide"))
    row = _until(store, lambda js: js[job].state == "RUNNING", config=config)[job]
    _exit_record(tmp_path, store, job)
    time.sleep(1.5)
    _round(store, config)
    from runtime_helpers import runs_of

    ends = {r.host: r.ended_at for r in runs_of(store, job)}
    ended = jobs_by_id(store)[job]
    assert ended.state == "COMPLETED" and ended.end_time == max(ends.values()), (ended.end_time, ends)
    assert 3.0 <= ended.end_time - row.start_time <= 5.5 and ends["m1"] < ends["m0"] - 2, ends


def test_a_job_that_backdates_its_exit_record_ends_no_earlier_than_the_last_round_saw_it_run(store, tmp_path):
    """The end's age is the record file's, which a job on an account host can set: it may move its end no
    earlier than the start of the round before the one that read it (which saw it running)."""
    add_host(store, HostSpec("m0", executor="local", vc="vc-a", telemetry="emulated", gpus=1,
                             workdir=str(tmp_path / "m0")))
    config = fast_config(**{"profiler.enabled": False})
    forge = ('D="$LUCID_WORKDIR/../../${LUCID_RUN_MARKER%.*}"; setsid sh -c "while [ ! -f $D/exit_code ]; do '
             'sleep 0.02; done; touch -m -d \'-300 days\' $D/exit_code" </dev/null >/dev/null 2>&1 & sleep 3')
    job = submit(store, JobRequest(forge, 1, "mallory", "vc-a", name="train"))
    _until(store, lambda js: js[job].state == "RUNNING", config=config)
    time.sleep(1.5)
    saw_running = time.time()
    _round(store, config)  # sees it running
    assert jobs_by_id(store)[job].state == "RUNNING"
    _exit_record(tmp_path, store, job)
    time.sleep(1.0)
    _round(store, config)
    row = jobs_by_id(store)[job]
    assert row.state == "COMPLETED" and row.end_time >= saw_running - 0.5, (row.end_time - saw_running)
