"""Unstable pairs are split live: real sshd hosts, real job processes, emulated per-process GPU telemetry.

Two jobs share main0's only GPU. Their telemetry agents emulate a time-sliced GPU: jobs whose
SM and bandwidth shares add up past 100 % slow each other down. A pair below the binder's
`unstable_speed` (0.7) is split by the next round after it settled; a light pair is left alone.
"""

from __future__ import annotations

import itertools
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
from runtime_helpers import SETTINGS, fast_config, jobs_by_id, one_round, pid_alive, register, rounds_until, runs_of
from sqlalchemy import select

from lucid_core.runtime.hosts.telemetry import parse_samples
from lucid_core.runtime.store.schema import DecisionRow, JobEventRow, JobRow, RunRow
from lucid_core.runtime.store.store import Store
from lucid_core.runtime.surfaces.explain import explain
from lucid_core.runtime.surfaces.submission import JobRequest, cancel, submit

pytestmark = pytest.mark.ssh

# agents beside main runs sample every 0.2 s; a pair's speed counts 1 s after its second job started
PAIR_SETTINGS = replace(SETTINGS, monitor_interval_s=0.2, speed_settle_s=1.0, speed_min_samples=4)
PROFILES = {
    "busy": (70.0, 80.0, 1500.0),  # Medium (70 % < 75 %): two of them pass the packing rules, but
    # need 140 % of the SMs and 160 % of the bandwidth: each runs at 100/160 = 0.62 of its speed
    "tiny": (12.0, 4.0, 1500.0),  # two of them fit in one GPU's time: no slowdown
}


def emulated_profile(job: JobRow) -> tuple[float, float, float]:
    return PROFILES[job.name.split("-")[0]]


def gated(root, name: str) -> tuple[str, object]:
    gate = root / f"gate-{name}-{time.monotonic_ns()}"
    return f"until [ -e {gate} ]; do sleep 0.05; done", gate


def running(*ids):
    return lambda jobs: all(jobs[j].state == "RUNNING" for j in ids)


def main_run(store: Store, job_id: str) -> RunRow:
    return next(r for r in runs_of(store, job_id) if r.kind == "main")


def unpairs(store: Store) -> list[DecisionRow]:
    with store.session() as s:
        return list(s.scalars(select(DecisionRow).where(DecisionRow.kind == "Unpair")))


@pytest.fixture
def live_pair(sshd_hosts, tmp_path):
    """A store with prof0 (2 GPUs) and main0 (1 GPU): a job that cannot start alone there must share."""
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    register(store, sshd_hosts, tmp_path / "hosts", gpus={"prof0": 2, "main0": 1})
    gates = []
    kwargs = {"settings": PAIR_SETTINGS, "emulated_profile": emulated_profile}

    def submit_gated(name: str) -> str:
        command, gate = gated(tmp_path, name)
        gates.append(gate)
        return submit(store, JobRequest(command, 1, "dana", "vc-a", name=name))

    yield store, sshd_hosts, submit_gated, kwargs
    for gate in gates:
        gate.touch()
    for job_id, row in jobs_by_id(store).items():
        if row.state not in ("COMPLETED", "FAILED", "CANCELLED"):
            cancel(store, job_id)
    try:
        rounds_until(store, sshd_hosts, fast_config(),
                     lambda jobs: all(j.state in ("COMPLETED", "CANCELLED") for j in jobs.values()), **kwargs)
    finally:
        store.dispose()


def pair_up(store, cluster, submit_gated, kwargs, kind: str) -> tuple[str, str]:
    a, b = submit_gated(f"{kind}-a"), submit_gated(f"{kind}-b")
    rounds_until(store, cluster, fast_config(), running(a, b), timeout_s=30, **kwargs)
    run_a, run_b = main_run(store, a), main_run(store, b)
    assert (run_a.host, run_a.gpu_indices) == (run_b.host, run_b.gpu_indices) == ("main0", [0])
    assert {run_a.partner, run_b.partner} == {a, b}
    return a, b


def test_a_pair_slower_than_unstable_speed_is_split_and_neither_job_shares_again(live_pair):
    store, cluster, submit_gated, kwargs = live_pair
    a, b = pair_up(store, cluster, submit_gated, kwargs, "busy")
    jobs = rounds_until(store, cluster, fast_config(), lambda j: j[a].no_share and j[b].no_share, timeout_s=30,
                        **kwargs)
    [split] = unpairs(store)
    assert split.status == "done" and {split.job_id, split.payload["partner"]} == {a, b}
    assert "below 0.7: neither job shares a GPU again" in split.reason
    speed = float(split.reason.split("pair runs at ")[1].split(" ")[0])
    assert 0.55 <= speed < 0.7  # the emulated contention share, 0.62, as the telemetry saw it
    with store.session() as s:
        events = {e.job_id: e.message for e in s.scalars(select(JobEventRow).where(JobEventRow.kind == "Unpair"))}
    assert set(events) == {a, b}
    assert all("measured" in m and "alone" in m and "emulated" in m for m in events.values())
    for me, other in ((a, b), (b, a)):  # `lucid explain` says why the job no longer shares
        sharing = explain(store, me, fast_config(), time.time())["sharing"]
        assert sharing["allowed"] is False and sharing["partner"] == other
        assert other in sharing["why"] and split.reason in sharing["why"] and "emulated" in sharing["measured"]
    # nothing is stopped: the pair runs on as it was, and is not split again round after round
    assert pid_alive(main_run(store, a).pid) and pid_alive(main_run(store, b).pid)
    assert jobs[a].state == jobs[b].state == "RUNNING"
    for _ in range(3):
        one_round(store, cluster, fast_config(), **kwargs)
    assert len(unpairs(store)) == 1

    # when a joins nothing any more, b would be free to share again; it may not: c waits for b's GPU
    gate_of(store, a).touch()
    rounds_until(store, cluster, fast_config(), lambda j: j[a].state == "COMPLETED", timeout_s=20, **kwargs)
    c = submit_gated("tiny-c")
    jobs = rounds_until(store, cluster, fast_config(), lambda j: j[c].profiled and j[c].state == "QUEUED",
                        timeout_s=30, **kwargs)
    for _ in range(3):
        jobs = one_round_jobs(store, cluster, kwargs)
    assert jobs[c].state == "QUEUED" and jobs[c].share_class == 0
    assert "no affine partner among 0 running 1-GPU job(s)" in jobs[c].pending_reason
    assert all(r.kind == "profiling" for r in runs_of(store, c))
    assert jobs[b].no_share and main_run(store, b).state == "running"


def test_a_pair_at_a_healthy_speed_is_left_alone_and_may_share_again(live_pair, tmp_path):
    store, cluster, submit_gated, kwargs = live_pair
    workroot = tmp_path / "hosts"
    a, b = pair_up(store, cluster, submit_gated, kwargs, "tiny")
    seen: dict[str, float] = {}
    deadline = time.monotonic() + 30
    while set(seen) != {a, b}:
        report = one_round(store, cluster, fast_config(), **kwargs)
        seen.update(report.pair_speeds)
        assert time.monotonic() < deadline, f"no speed observed for both jobs: {seen}"
        time.sleep(0.2)
    assert set(seen) == {a, b} and all(v >= 0.9 for v in seen.values()), seen  # measured, and healthy
    assert main_run(store, b).observed_speed >= 0.9  # kept
    for _ in range(3):
        one_round(store, cluster, fast_config(), **kwargs)
    jobs = jobs_by_id(store)
    assert unpairs(store) == [] and not jobs[a].no_share and not jobs[b].no_share
    assert explain(store, a, fast_config(), time.time())["sharing"] == {"allowed": True}

    # once a ends, b takes a new partner: the contrast to the split pair above
    gate_of(store, a).touch()
    rounds_until(store, cluster, fast_config(), lambda j: j[a].state == "COMPLETED", timeout_s=20, **kwargs)
    c = submit_gated("tiny-c")
    rounds_until(store, cluster, fast_config(), running(c), timeout_s=30, **kwargs)
    assert main_run(store, c).partner == b and main_run(store, c).gpu_indices == [0]
    assert main_run(store, b).observed_speed is None  # b's speed beside a is not its speed beside c
    # b's watching agent wrote its first sample, then only samples taken while a or c shared its GPU,
    # none while it ran alone in between: the file the round reads stays bounded (TelemetryLog)
    run_b = main_run(store, b)
    path = workroot / run_b.host / run_b.run_id / "telemetry.jsonl"
    deadline = time.monotonic() + 10
    while not any(r["t"] > main_started_at(store, c) for r in parse_samples(path.read_text())):
        assert time.monotonic() < deadline, "b's agent wrote no sample beside c"
        time.sleep(0.2)
    samples = parse_samples(path.read_text())
    assert len(samples) > 8 and all(r["others"] >= 1 for r in samples[1:])
    alone_s = max(later["t"] - earlier["t"] for earlier, later in itertools.pairwise(samples[1:]))
    assert alone_s > 1.0, alone_s  # at 0.2 s a sample: b's stretch alone left a gap, not samples


def main_started_at(store: Store, job_id: str) -> float:
    """When the main run of `job_id` started (host and store share a clock here)."""
    return float(main_run(store, job_id).started_at or 0.0)


def gate_of(store: Store, job_id: str) -> Path:
    """The gate file a gated job waits for (read back from its command)."""
    with store.session() as s:
        command = s.get(JobRow, job_id).command
    return Path(command.split("[ -e ")[1].split(" ]")[0])


def one_round_jobs(store: Store, cluster, kwargs) -> dict[str, JobRow]:
    one_round(store, cluster, fast_config(), **kwargs)
    time.sleep(0.2)
    return jobs_by_id(store)


def test_a_measured_pair_speed_is_stored_shown_and_slows_the_eta(live_pair):
    """A pair at the emulated 0.62 that may stay (unstable_speed lowered): its measured speed is
    kept per run, shown by explain, the job status and the metrics, and paces `lucid eta`."""
    from fastapi.testclient import TestClient
    from prometheus_client.parser import text_string_to_metric_families

    from lucid_core.runtime.surfaces.api import create_app
    from lucid_core.runtime.surfaces.eta import estimate
    from lucid_core.runtime.surfaces.explain import shared_speed_line
    from lucid_core.runtime.surfaces.prometheus import render
    from lucid_core.runtime.surfaces.queries import status

    store, cluster, submit_gated, kwargs = live_pair
    config = fast_config(**{"binder.unstable_speed": 0.3})  # 0.62 is slow, but not slow enough to split
    a, b = submit_gated("busy-a"), submit_gated("busy-b")
    rounds_until(store, cluster, config, running(a, b), timeout_s=30, **kwargs)
    assert {main_run(store, a).partner, main_run(store, b).partner} == {a, b}
    assert main_run(store, a).observed_speed is None  # nothing kept before the pair has settled
    deadline = time.monotonic() + 30
    while True:
        round_started = time.time()
        report = one_round(store, cluster, config, **kwargs)
        if {a, b} <= set(report.pair_speeds):
            break
        assert time.monotonic() < deadline, f"no speed observed for both jobs: {report.pair_speeds}"
        time.sleep(0.2)
    stored = {j: main_run(store, j) for j in (a, b)}
    for job_id, run in stored.items():
        assert run.observed_speed == report.pair_speeds[job_id]  # what the round estimated, kept
        assert 0.55 <= run.observed_speed < 0.7, run.observed_speed  # the emulated 0.62, as telemetry saw it
        assert run.observed_speed_emulated is True and run.observed_speed_samples >= PAIR_SETTINGS.speed_min_samples
        assert round_started - 1.0 <= run.observed_speed_at <= time.time()
    assert unpairs(store) == []

    # explain, the job status (library and HTTP API) and the metrics say it
    now = time.time()
    shared = explain(store, a, config, now)["shared"]
    assert shared["partner"] == b and shared["speed"] == stored[a].observed_speed
    assert shared["samples"] == stored[a].observed_speed_samples and 0 <= shared["age_s"] < 30
    line = shared_speed_line(shared)
    assert line.startswith(f"speed while shared with {b}: {stored[a].observed_speed:.2f} of its speed alone")
    assert f"over {stored[a].observed_speed_samples} samples of emulated telemetry" in line
    cli = subprocess.run([sys.executable, "-m", "lucid_core.cli", "explain", a, "--store", store.url],
                         capture_output=True, text=True, timeout=60, check=True)
    assert f"speed while shared with {b}: {stored[a].observed_speed:.2f} of its speed alone" in cli.stdout
    assert status(store, a)["shared"]["speed"] == stored[a].observed_speed
    api = TestClient(create_app(store.url, store=store)).get(f"/jobs/{b}").json()
    assert api["shared"]["partner"] == a and api["shared"]["speed"] == stored[b].observed_speed
    got = {(s.name, tuple(sorted(s.labels.items()))): s.value
           for family in text_string_to_metric_families(render(store).decode()) for s in family.samples}
    assert got[("lucid_shared_jobs", (("vc", "vc-a"),))] == 2
    assert got[("lucid_shared_speed_min", (("vc", "vc-a"),))] == min(r.observed_speed for r in stored.values())

    # eta: the pair runs at its measured speeds, the survivor alone at full speed once the other ends
    etas = {j: estimate(store, j, config, now) for j in (a, b)}
    rates = {j: stored[j].observed_speed for j in (a, b)}
    left = {j: max(0.0, etas[j].predicted_duration - (now - stored[j].started_at)) for j in (a, b)}
    assert all(v > 10.0 for v in left.values()), left  # long enough for the rate to matter
    first = min((a, b), key=lambda j: left[j] / rates[j])
    second = b if first == a else a
    first_end = now + left[first] / rates[first]
    second_end = first_end + left[second] - (first_end - now) * rates[second]
    assert etas[first].end == pytest.approx(first_end, abs=1e-3)
    assert etas[second].end == pytest.approx(second_end, abs=1e-3)
    assert etas[first].end > now + left[first] / (1 / 1.4) + 1.0  # the profiles' speed, 1/1.4, ends sooner
