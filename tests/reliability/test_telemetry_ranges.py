"""Telemetry a job wrote into its own run's file is believed only within the ranges NVML reports in (B28).

A job can append to its run's telemetry.jsonl (on an account host it is the SSH account's file). Finite but
impossible figures used to pass: a negative GPU utilization made its profile Tiny, so any partner could share
its GPU, and a 20-digit GPU index failed the store's write, so every round raised while its window was due;
a line with an integer of more digits than Python converts raised out of the pair-speed read the same way.
Real processes on local hosts with emulated telemetry.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import replace
from pathlib import Path

import pytest
from lucid_invariants import TERMINAL
from runtime_helpers import SETTINGS, fast_config, jobs_by_id, runs_of

from lucid_core.runtime.hosts.inventory import HostSpec, add_host
from lucid_core.runtime.hosts.local_executor import local_executor
from lucid_core.runtime.hosts.telemetry import estimate_shared_speed, parse_samples, summarize
from lucid_core.runtime.round.scheduling_round import RoundReport, SchedulingRound
from lucid_core.runtime.store.store import Store
from lucid_core.runtime.surfaces.submission import JobRequest, submit

LIGHT = (12.0, 4.0, 1500.0)  # Tiny by the utilization rule of emulated hosts: two of them pair
GOOD = {"t": 10.0, "gpu": 0, "gpu_util": 40.0, "mem_util": 10.0, "mem_used_mb": 900.0, "job_mem_mb": 800.0,
        "job_sm_util": 30.0, "others": 1, "emulated": True}


@pytest.mark.parametrize("field, value", [
    ("gpu_util", -1e300), ("gpu_util", 100.5), ("mem_util", -5), ("mem_used_mb", -100), ("job_mem_mb", -1.0),
    ("job_sm_util", -3.0), ("job_sm_util", 1e9), ("gpu", 10**20), ("gpu", 4096), ("others", -1),
])
def test_a_sample_with_a_figure_nvml_cannot_report_is_not_believed(field, value):
    text = json.dumps(GOOD) + "\n" + json.dumps({**GOOD, "t": 11.0, field: value}) + "\n"
    assert parse_samples(text) == [GOOD]


def test_a_line_with_an_integer_too_long_to_convert_is_skipped_not_raised():
    huge = '{"t": 11, "gpu": 0, "gpu_util": 5, "mem_util": 1, "others": 1' + "0" * 5000 + "}"
    assert parse_samples(json.dumps(GOOD) + "\n" + huge + "\n") == [GOOD]


def test_forged_samples_cannot_lower_a_profile_or_raise_a_shared_speed():
    real = [{**GOOD, "t": float(t)} for t in range(20)]
    forged = [{**GOOD, "t": float(t), "gpu_util": -1e300, "job_mem_mb": -1e6, "job_sm_util": 1e6}
              for t in range(20)]
    text = "\n".join(json.dumps(r) for r in real + forged)
    samples = parse_samples(text)
    profile = summarize(samples)
    assert profile["gpu_util"] == pytest.approx(40.0) and profile["gpu_mem_mb"] == 800.0
    estimate = estimate_shared_speed(samples, 60.0, since=0.0, min_samples=5)
    assert estimate is not None and estimate.speed == pytest.approx(0.5)


def _run_until_done(store: Store, settings=SETTINGS, timeout_s: float = 60.0, **config) -> list[RoundReport]:
    """Rounds until every job ended; a round that raises fails the test (no job may break a round)."""
    reports, deadline = [], time.monotonic() + timeout_s
    while True:
        reports.append(SchedulingRound(store, local_executor(), fast_config(**config), settings,
                                       emulated_profile=lambda job: LIGHT).run())
        jobs = jobs_by_id(store)
        if all(j.state in TERMINAL for j in jobs.values()):
            return reports
        assert time.monotonic() < deadline, {j: (r.state, r.pending_reason) for j, r in jobs.items()}
        time.sleep(0.2)


# appends to its own run's file through its profiling window: utilizations below zero, and one line whose GPU
# index no store column holds; then runs on well past its window, so that a round reads the window while it
# runs however slow the machine (a job that ends before a round reached its window's end keeps no profile)
POISON = r'''R="$LUCID_WORKDIR/../../$LUCID_RUN_ID/telemetry.jsonl"
printf '{"t": %s, "gpu": 99999999999999999999, "gpu_util": 50, "mem_util": 5}\n' "$(date +%s)" >> "$R"
end=$(( $(date +%s) + 4 ))
while [ "$(date +%s)" -lt "$end" ]; do
  for i in 1 2 3 4 5 6 7 8 9 10; do
    printf '{"t": %s, "gpu": 0, "gpu_util": -1e300, "mem_util": -5, "mem_used_mb": -1, "job_mem_mb": -1}\n' \
      "$(date +%s)" >> "$R"
  done
  sleep 0.1
done
sleep 4'''


def test_a_job_that_writes_impossible_figures_in_its_window_gets_a_true_profile_and_breaks_no_round(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'store.db'}")
    add_host(store, HostSpec("p0", executor="local", pool="profiling", vc="vc-a", telemetry="emulated", gpus=1,
                             workdir=str(tmp_path / "p0")))
    add_host(store, HostSpec("m0", executor="local", vc="vc-a", telemetry="emulated", gpus=2,
                             workdir=str(tmp_path / "m0")))
    poisoner = submit(store, JobRequest(POISON, 1, "mallory", "vc-a", name="poison"))
    plain = submit(store, JobRequest("sleep 2", 1, "ann", "vc-a", name="plain"))
    reports = _run_until_done(store, **{"profiler.tprof_s": 3})
    profiled_run = next(r for r in runs_of(store, poisoner) if r.kind == "profiling")
    poisoned = (tmp_path / "p0" / profiled_run.run_id / "telemetry.jsonl").read_text()
    assert "-1e300" in poisoned and "99999999999999999999" in poisoned  # the poison reached the file read
    jobs = jobs_by_id(store)
    assert jobs[poisoner].state == jobs[plain].state == "COMPLETED"
    assert not [e for r in reports for e in r.errors]
    row = jobs[poisoner]
    assert row.profiled
    assert row.gpu_util == pytest.approx(LIGHT[0], rel=0.1) and row.mem_util == pytest.approx(LIGHT[1], rel=0.1)
    assert row.gpu_mem_mb == pytest.approx(LIGHT[2])
    store.dispose()


def test_a_pair_member_that_writes_an_unconvertible_integer_into_its_telemetry_breaks_no_round(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'store.db'}")
    add_host(store, HostSpec("p0", executor="local", pool="profiling", vc="vc-a", telemetry="emulated", gpus=1,
                             workdir=str(tmp_path / "p0")))
    add_host(store, HostSpec("m0", executor="local", vc="vc-a", telemetry="emulated", gpus=1,
                             workdir=str(tmp_path / "m0")))
    flag = tmp_path / "poisoned"
    line = '{"t": 1, "gpu": 0, "gpu_util": 5, "mem_util": 1, "others": 1' + "0" * 5000 + "}"
    # the main run (the profiling run has no partner) appends the line to its own file each second
    poison = (f'case "$LUCID_RUN_ID" in *-main*) R="$LUCID_WORKDIR/../../$LUCID_RUN_ID/telemetry.jsonl"; '
              f"for i in 1 2 3 4 5 6; do echo '{line}' >> \"$R\"; : > {flag}; sleep 1; done ;; *) sleep 30 ;; esac")
    a = submit(store, JobRequest(poison, 1, "mallory", "vc-a", name="light-a"))
    plain = 'case "$LUCID_RUN_ID" in *-main*) sleep 8 ;; *) sleep 30 ;; esac'  # its profiling run is stopped
    b = submit(store, JobRequest(plain, 1, "ann", "vc-a", name="light-b"))
    settings = replace(SETTINGS, monitor_interval_s=0.2, speed_settle_s=0.5, speed_min_samples=2)
    reports = _run_until_done(store, settings, timeout_s=90.0)
    assert flag.exists()
    main_a = next(r for r in runs_of(store, a) if r.kind == "main")
    assert main_a.partner == b  # the two shared the GPU: their telemetry was read for the pair's speed
    assert line in Path(tmp_path / "m0" / main_a.run_id / "telemetry.jsonl").read_text()
    jobs = jobs_by_id(store)
    assert jobs[a].state == jobs[b].state == "COMPLETED"
    assert not [e for r in reports for e in r.errors]
    assert not any(math.isnan(v) for r in reports for v in r.pair_speeds.values())
    store.dispose()
