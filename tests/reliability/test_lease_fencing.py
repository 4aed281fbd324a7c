"""One writer at a time: a round stalled between its snapshot and its writes past its lease, while
another round takes the lease over, writes and launches nothing (issue: jobs ran twice).

Real processes throughout: the stalled round is a child process (`lucid round`, or the round DAG's
task functions), the round that takes over is `lucid round` (or the task functions) in another, the
jobs are local processes that write a ledger on their host (start and end time, GPUs, host). The
assertions read that ledger: each job started once, no GPU held by two runs at once.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest
from fault_injection import add_local_hosts
from runtime_helpers import jobs_by_id
from sqlalchemy import select

from lucid_core.config import load_config
from lucid_core.runtime.hosts.local_executor import local_executor
from lucid_core.runtime.round.scheduling_round import RoundSettings, SchedulingRound
from lucid_core.runtime.store.schema import RoundRow
from lucid_core.runtime.store.store import Store
from lucid_core.runtime.surfaces.submission import JobRequest, submit

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CONFIG = ("[profiler]\ntprof_s = 1.0\nin_place = false\n[binder]\nsharing = \"off\"\n"
          "[forecast]\nmode_check_interval_s = 1.0\n[runtime]\nstop_grace_s = 1.0\ntelemetry_interval_s = 0.25\n")


def ledger_job(ledger: Path, seconds: float) -> str:
    """A job that writes its start and end on the host: job, run, GPUs, working directory, wall clock.

    Its profiling run waits to be stopped at its window's end: on a loaded machine a round can come later than
    a short job's length, and a job that ended within its profiling window would complete there, never run
    on a main host and leave the test's set-up (a job waiting for a main GPU) unmet.
    """
    return ('case "$LUCID_RUN_ID" in *-prof*) exec sleep 600;; esac; '
            f'echo "S $LUCID_JOB_ID $LUCID_RUN_ID $CUDA_VISIBLE_DEVICES $PWD $(date +%s.%N)" >> {ledger}; '
            f'sleep {seconds}; echo "E $LUCID_JOB_ID $LUCID_RUN_ID $(date +%s.%N)" >> {ledger}')


def read_ledger(ledger: Path) -> tuple[dict[str, list[str]], dict[tuple[str, int], list[tuple[float, float, str]]]]:
    """job -> main runs started; (host, GPU) -> [(start, end, main run)] from the hosts' own record (profiling
    runs write none: `ledger_job`)."""
    starts: dict[str, list[str]] = defaultdict(list)
    spans: dict[str, tuple[str, list[int], float]] = {}
    ends: dict[str, float] = {}
    for line in ledger.read_text().splitlines():
        w = line.split()
        if "-main" not in w[2]:
            continue
        if w[0] == "S":
            starts[w[1]].append(w[2])
            host = re.search(r"/hosts/([^/]+)/", w[4] + "/").group(1)
            spans[w[2]] = (host, [int(i) for i in w[3].split(",")], float(w[5]))
        elif w[0] == "E":
            ends[w[2]] = float(w[3])
    per_gpu: dict[tuple[str, int], list[tuple[float, float, str]]] = defaultdict(list)
    for run, (host, gpus, began) in spans.items():
        for gpu in gpus:
            per_gpu[(host, gpu)].append((began, ends.get(run, float("inf")), run))
    return starts, per_gpu


def assert_one_writer(ledger: Path, jobs: list[str]) -> None:
    starts, per_gpu = read_ledger(ledger)
    twice = {job: runs for job, runs in starts.items() if len(runs) > 1}
    assert not twice, f"jobs started more than once on the hosts: {twice}"
    assert set(jobs) <= set(starts), f"jobs that never ran: {set(jobs) - set(starts)}"
    for gpu, spans in per_gpu.items():
        spans.sort()
        for (_a0, a1, ra), (b0, _b1, rb) in itertools.pairwise(spans):
            assert b0 >= a1, f"GPU {gpu} held by {ra} and {rb} at once"


def _env(tmp_path: Path, ttl_s: float) -> dict[str, str]:
    config = tmp_path / "lucid.toml"
    config.write_text(CONFIG)
    return {**os.environ, "LUCID_CONFIG": str(config), "LUCID__RUNTIME__LEASE_TTL_S": str(ttl_s),
            "PYTHONPATH": os.pathsep.join([str(REPO), str(HERE.parent / "runtime"), str(HERE),
                                           os.environ.get("PYTHONPATH", "")])}


def _lucid_round(store: Store, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lucid_core.cli", "round", "--store", store.url,
                           "--config", env["LUCID_CONFIG"]], env=env, capture_output=True, text=True,
                          timeout=60)


def _dag_round(store: Store, env: dict[str, str]) -> subprocess.CompletedProcess:
    code = ("import sys; sys.path.insert(0, 'plugins'); from lucid_airflow import round_steps as r; "
            f"u = {store.url!r}; r.carry_out(u, r.profile_bind_and_place(u, r.reconcile(u)))")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60,
                          cwd=REPO)


@pytest.mark.parametrize("driver", ["cli", "dag"])
@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_round_stalled_past_its_lease_is_fenced_and_jobs_run_once(tmp_path, backend, driver, request):
    store = (Store(f"sqlite:///{tmp_path / 'lucid.db'}") if backend == "sqlite"
             else request.getfixturevalue("fresh_pg_store"))
    add_local_hosts(store, tmp_path / "hosts")  # p0 profiling, m0 and m1 main: 2 GPUs each
    ledger = tmp_path / "ledger"
    env = _env(tmp_path, ttl_s=30)
    round_of = _lucid_round if driver == "cli" else _dag_round
    config = load_config(env["LUCID_CONFIG"])

    def in_process_round() -> None:  # the set-up and wind-down rounds (a process start each would be slow)
        SchedulingRound(store, local_executor(), config, RoundSettings.from_config(config, holder="setup")).run()

    # 20 s: the four waiting jobs are profiled and queued while the blockers run (10 s was too short twice in
    # loaded CI runs: "a blocker ended before the waiting jobs queued")
    blockers = [submit(store, JobRequest(ledger_job(ledger, 20), 1, "u", "vc-a", name=f"block{i}"))
                for i in range(4)]
    deadline = time.monotonic() + 60
    while not all(jobs_by_id(store)[j].state == "RUNNING" for j in blockers):
        in_process_round()
        assert time.monotonic() < deadline, {j: r.state for j, r in jobs_by_id(store).items()}
        time.sleep(0.2)
    waiting = [submit(store, JobRequest(ledger_job(ledger, 3), 1, "u", "vc-a", name=f"wait{i}")) for i in range(4)]
    while not all(jobs_by_id(store)[j].state == "QUEUED" for j in waiting):  # profiled; main is full
        in_process_round()
        assert time.monotonic() < deadline, {j: r.state for j, r in jobs_by_id(store).items()}
        time.sleep(0.2)
    assert not any(line.startswith("E ") and line.split()[1] in blockers for line in ledger.read_text().splitlines()), \
        "a blocker ended before the waiting jobs queued: set-up too slow"
    while sum(line.startswith("E ") and line.split()[1] in blockers
              for line in ledger.read_text().splitlines()) < 4:  # the blockers end; no round has seen it yet
        assert time.monotonic() < deadline
        time.sleep(0.2)

    # round A: lease TTL 2 s, stalls after its snapshot; B starts once A's lease lapsed and takes it over
    go = tmp_path / "go"
    slow = subprocess.Popen([sys.executable, str(HERE / "slow_round_child.py"), store.url, str(go), driver],
                            env=_env(tmp_path, ttl_s=2), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while "STALLED" not in (line := slow.stderr.readline()):  # (warnings may come first)
        assert line, "the slow round ended before its snapshot"
    time.sleep(2.5)
    taken = round_of(store, env)
    assert taken.returncode == 0, taken.stderr[-2000:]
    go.touch()  # A goes on, 2.5 s plus B's whole round past its snapshot
    out, _err = slow.communicate(timeout=60)
    while not all(jobs_by_id(store)[j].state in ("COMPLETED", "FAILED") for j in blockers + waiting):
        in_process_round()
        assert time.monotonic() < deadline + 60, {j: r.state for j, r in jobs_by_id(store).items()}
        time.sleep(0.3)

    assert_one_writer(ledger, blockers + waiting)
    assert all(jobs_by_id(store)[j].state == "COMPLETED" for j in blockers + waiting)
    report = json.loads(out) if driver == "cli" else json.loads(out.strip().splitlines()[-1])
    if driver == "cli":
        assert slow.returncode == 4 and "taken over" in report["fenced"] and not report["launched"]
    else:
        fenced = report["decide"].get("fenced") or report["reconcile"].get("fenced")
        assert fenced and "taken over" in fenced and not report["carry_out"].get("launched")
    with store.session() as s:
        rows = list(s.scalars(select(RoundRow).where(RoundRow.fenced.is_(True))))
    assert len(rows) == 1 and "taken over" in rows[0].error
    store.dispose()
