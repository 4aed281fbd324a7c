"""Speed of a shared job from telemetry: the estimator, the emulated GPU's contention, the pair reader."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lucid_core.runtime.hosts import telemetry_agent
from lucid_core.runtime.hosts.telemetry import estimate_shared_speed, first_window, parse_samples
from lucid_core.runtime.hosts.telemetry_agent import EmulatedBackend, EmulatedDeviceTable, contention_speed
from lucid_core.runtime.round.pair_speed import PairSpeedSettings, observe_pair_speeds, running_pairs
from lucid_core.runtime.round.snapshot import Snapshot
from lucid_core.runtime.store.schema import JobRow, ProfileRow, RunRow


def shared(t: float, sm: float | None, others: int = 1, emulated: bool = True) -> dict:
    return {"t": t, "gpu": 0, "gpu_util": 90.0, "mem_util": 40.0, "job_sm_util": sm, "others": others,
            "emulated": emulated}


def test_speed_is_shared_sm_util_over_exclusive_util_from_settled_shared_samples():
    samples = ([shared(t, 70.0, others=0) for t in range(0, 10)]  # alone: not a shared sample
               + [shared(t, 10.0) for t in range(10, 20)]  # partner starting up: before `since`
               + [shared(t, 33.0 + (t % 2) * 4) for t in range(20, 32)]  # settled: mean 35
               + [shared(32, None)])  # no per-process figure: ignored
    estimate = estimate_shared_speed(samples, 70.0, since=20.0, min_samples=10)
    assert estimate is not None
    assert estimate.samples == 12 and estimate.shared_sm_util == pytest.approx(35.0)
    assert estimate.speed == pytest.approx(0.5) and estimate.emulated
    assert "35.0% shared vs 70.0% alone = 0.50 over 12 samples, emulated" in estimate.describe()
    # only the latest samples count when there are many
    latest = estimate_shared_speed(samples, 70.0, since=20.0, min_samples=2, max_samples=2)
    assert latest is not None and latest.samples == 2 and latest.shared_sm_util == pytest.approx(35.0)


def test_speed_is_clipped_to_one_and_needs_enough_samples_and_a_busy_job():
    busy = [shared(t, 80.0, emulated=False) for t in range(12)]
    faster = estimate_shared_speed(busy, 60.0, since=0.0)
    assert faster is not None and faster.speed == 1.0 and not faster.emulated
    assert estimate_shared_speed(busy[:9], 60.0, since=0.0, min_samples=10) is None
    assert estimate_shared_speed(busy, 60.0, since=3.0, min_samples=10) is None  # 9 settled samples
    assert estimate_shared_speed(busy, 2.0, since=0.0) is None  # nearly idle alone: no meaningful ratio
    zero = estimate_shared_speed([shared(t, 0.0) for t in range(10)], 50.0, since=0.0)
    assert zero is not None and zero.speed == 0.0
    assert estimate_shared_speed(parse_samples("garbage\n[1, 2]\n"), 50.0, since=0.0, min_samples=1) is None


def test_first_window_keeps_the_profiling_window_of_a_longer_recording():
    rows = [{"t": 100.0 + k, "gpu_util": 1.0} for k in range(30)]
    assert [r["t"] for r in first_window(rows, 5.0)] == [100.0, 101.0, 102.0, 103.0, 104.0, 105.0]
    assert first_window([], 5.0) == []


def test_contention_slows_jobs_only_when_their_shares_exceed_the_gpu():
    assert contention_speed((30.0, 20.0), []) == 1.0
    assert contention_speed((30.0, 20.0), [(40.0, 30.0)]) == 1.0
    assert contention_speed((70.0, 80.0), [(70.0, 80.0)]) == pytest.approx(100 / 160)
    assert contention_speed((90.0, 10.0), [(60.0, 10.0)]) == pytest.approx(100 / 150)


@pytest.fixture
def two_jobs():
    jobs = [subprocess.Popen(["sleep", "30"], start_new_session=True) for _ in range(2)]
    yield jobs
    for job in jobs:
        job.kill()
        job.wait()


def test_emulated_backends_on_one_gpu_see_each_other_and_slow_down(tmp_path, two_jobs):
    """Two emulated agents registered on GPU 0 of one host: each job's SM utilization drops to its
    contention share; on another GPU, or once the other job is gone, it runs alone again."""
    table = EmulatedDeviceTable(str(tmp_path / ".emulated-gpus"))
    a = EmulatedBackend([0], gpu_util=70.0, mem_util=80.0, mem_mb=1500.0, seed=1, noise=0.0, device_table=table)
    b = EmulatedBackend([0], gpu_util=70.0, mem_util=80.0, mem_mb=2500.0, seed=2, noise=0.0, device_table=table)
    elsewhere = EmulatedBackend([1], gpu_util=50.0, mem_util=10.0, mem_mb=100.0, device_table=table, noise=0.0)
    first, second = two_jobs
    [alone] = a.sample(first.pid)
    assert alone["job_sm_util"] == 70.0 and alone["others"] == 0 and alone["emulated"]
    [b_record] = b.sample(second.pid)
    [a_record] = a.sample(first.pid)
    for record in (a_record, b_record):
        assert record["others"] == 1 and record["emulated"] is True
        assert record["job_sm_util"] == pytest.approx(70.0 * 100 / 160)
        assert record["gpu_util"] == pytest.approx(140.0 * 100 / 160)  # the GPU's figure adds both jobs
        assert record["mem_used_mb"] == 4000.0
    assert a_record["job_mem_mb"] == 1500.0 and b_record["job_mem_mb"] == 2500.0
    [other_gpu] = elsewhere.sample(first.pid + 100000)
    assert other_gpu["others"] == 0 and other_gpu["job_sm_util"] == 50.0
    second.kill()
    second.wait()
    [after] = a.sample(first.pid)
    assert after["others"] == 0 and after["job_sm_util"] == 70.0
    assert sorted(p.name for p in (tmp_path / ".emulated-gpus").iterdir()) == sorted(
        [f"{first.pid}.json", f"{first.pid + 100000}.json"])  # the dead job's entry was removed


def test_standalone_agents_in_one_work_directory_share_the_emulated_gpu(tmp_path, two_jobs):
    """Shipped as a file into a host's work directory, the agents find each other there."""
    script = tmp_path / "agent.py"
    script.write_text(Path(telemetry_agent.__file__).read_text())
    agents = []
    for k, job in enumerate(two_jobs):
        run = tmp_path / f"run{k}"
        run.mkdir()
        (run / "pid").write_text(str(job.pid))
        agents.append(subprocess.Popen(
            [sys.executable, "-I", str(script), "sample", "--pid-file", "pid", "--gpus", "0", "--interval", "0.05",
             "--duration", "1.5", "--emulate", "70,80,1000", "--out", "t.jsonl"], cwd=run))
    for agent in agents:
        assert agent.wait(timeout=20) == 0
    for k in range(2):
        rows = parse_samples((tmp_path / f"run{k}" / "t.jsonl").read_text())
        together = [r for r in rows if r["others"] == 1]
        assert len(together) >= 5 and all(r["emulated"] for r in rows)
        estimate = estimate_shared_speed(rows, 70.0, since=together[0]["t"], min_samples=5)
        assert estimate is not None and estimate.speed == pytest.approx(100 / 160, abs=0.03)


def _run(job_id: str, partner: str | None, started_at: float | None, state: str = "running", **kw) -> RunRow:
    return RunRow(run_id=f"{job_id}-main1", host="h0", job_id=job_id, kind="main", pool="main", gpu_indices=[0],
                  node_rank=0, partner=partner, state=state, planned_at=0.0, started_at=started_at, **kw)


def _job(job_id: str, util: float, no_share: bool = False) -> JobRow:
    return JobRow(job_id=job_id, seq=1, user="u", vc="v", gpus=1, command="true", state="RUNNING", submit_time=0.0,
                  profiled=True, gpu_util=util, no_share=no_share)


def _snapshot(runs: list[RunRow], jobs: list[JobRow]) -> Snapshot:
    profiles = {j.job_id: ProfileRow(job_id=j.job_id, run_id="p", gpu_util=j.gpu_util, mem_util=1.0, gpu_mem_mb=1.0,
                                     samples=5, window_s=1.0, emulated=True, created_at=0.0) for j in jobs}
    return Snapshot(hosts=[], gpu_counts={}, jobs={j.job_id: j for j in jobs}, runs=runs, profiles=profiles, state={})


def test_pairs_report_their_slower_member_once_settled():
    now = time.time()
    a, b = _job("a", 70.0), _job("b", 40.0)
    snapshot = _snapshot([_run("a", "b", now - 100), _run("b", "a", now - 30)], [a, b])
    texts = {"a-main1": [shared(now - 30 + t, 49.0) for t in range(30)],   # 0.70 of 70
             "b-main1": [shared(now - 30 + t, 24.0) for t in range(30)]}   # 0.60 of 40
    read: list[str] = []  # what the round asked the hosts for

    def reader(run: RunRow) -> str:
        read.append(run.run_id)
        return "\n".join(json.dumps(r) for r in texts[run.run_id])

    settled = observe_pair_speeds(snapshot, reader, now, PairSpeedSettings(settle_s=10.0, min_samples=10))
    assert settled.reports == [("b", pytest.approx(0.6))]
    assert settled.estimates["a"].speed == pytest.approx(0.7) and settled.estimates["a"].samples == 20
    assert sorted(read) == ["a-main1", "b-main1"]
    read.clear()
    early = observe_pair_speeds(snapshot, reader, now, PairSpeedSettings(settle_s=40.0, min_samples=10))
    assert early.reports == [] and read == []  # not settled: the hosts are not even asked


def test_only_live_unsplit_pairs_are_watched():
    now = time.time()
    a, b, c, d = _job("a", 70.0), _job("b", 70.0), _job("c", 70.0, no_share=True), _job("d", 70.0)
    runs = [_run("a", "b", now), _run("b", "a", now), _run("c", "d", now), _run("d", "c", now)]
    assert [(x.job_id, y.job_id) for x, y in running_pairs(_snapshot(runs, [a, b, c, d]))] == [("a", "b")]
    stopping = [_run("a", "b", now, stop_reason="cancel"), _run("b", "a", now)]
    assert running_pairs(_snapshot(stopping, [a, b])) == []
    planned = [_run("a", "b", now), _run("b", "a", None, state="planned")]
    assert running_pairs(_snapshot(planned, [a, b])) == []
    alone = [_run("a", "b", now)]  # its partner ended
    assert running_pairs(_snapshot(alone, [a, b])) == []
