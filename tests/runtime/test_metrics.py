"""Prometheus metrics read from the store after real rounds (local executor), on SQLite and PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from runtime_helpers import SETTINGS, fast_config, jobs_by_id

from lucid_core.runtime.hosts.inventory import HostSpec, add_host, drain_host
from lucid_core.runtime.hosts.local_executor import local_executor
from lucid_core.runtime.round.scheduling_round import SchedulingRound
from lucid_core.runtime.surfaces.api import create_app
from lucid_core.runtime.surfaces.prometheus import render
from lucid_core.runtime.surfaces.submission import JobRequest, cancel, submit

REPO = Path(__file__).resolve().parents[2]


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_show_queue_gpus_hosts_and_rounds(store, tmp_path):
    add_host(store, HostSpec("m0", executor="local", vc="vc-a", telemetry="emulated", gpus=2,
                             workdir=str(tmp_path / "m0")))
    add_host(store, HostSpec("m1", executor="local", vc="vc-b", telemetry="emulated", gpus=2,
                             workdir=str(tmp_path / "m1")))
    drain_host(store, "m1")  # vc-b's only host takes no new work: its job waits
    config = fast_config(**{"binder.sharing": "off"})  # no profiling pool here: jobs are profiled online
    # the 1-GPU job goes first (smaller GPUs x predicted duration); the 2-GPU one then no longer fits
    narrow = submit(store, JobRequest("sleep 30", gpus=1, user="bob", vc="vc-a", name="narrow"))
    waiting = submit(store, JobRequest("sleep 30", gpus=2, user="ana", vc="vc-a", name="wide"))
    submit(store, JobRequest("sleep 30", gpus=2, user="carl", vc="vc-b", name="behind-a-drained-host"))
    deadline = time.monotonic() + 20
    while jobs_by_id(store)[narrow].state != "RUNNING":
        SchedulingRound(store, local_executor(), config, SETTINGS).run()
        assert time.monotonic() < deadline, {j: r.state for j, r in jobs_by_id(store).items()}
        time.sleep(0.2)
    assert jobs_by_id(store)[waiting].state == "QUEUED"
    now = time.time()
    client = TestClient(create_app(store.url, store=store, clock=lambda: now + 100))
    reply = client.get("/metrics")
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/plain")
    got = _samples(reply.text)

    assert got[("lucid_jobs", (("state", "RUNNING"),))] == 1
    assert got[("lucid_jobs", (("state", "QUEUED"),))] + got[("lucid_jobs", (("state", "SUBMITTED"),))] == 2
    assert got[("lucid_queue_jobs", (("vc", "vc-a"),))] == 1
    assert got[("lucid_queue_gpus", (("vc", "vc-b"),))] == 2
    submitted = {j.job_id: j.submit_time for j in jobs_by_id(store).values()}
    assert abs(got[("lucid_oldest_wait_seconds", (("vc", "vc-a"),))] - (now + 100 - submitted[waiting])) < 1e-3
    assert got[("lucid_gpus", (("pool", "main"), ("state", "busy"), ("vc", "vc-a")))] == 1
    assert got[("lucid_gpus", (("pool", "main"), ("state", "idle"), ("vc", "vc-a")))] == 1
    assert got[("lucid_gpus", (("pool", "main"), ("state", "idle"), ("vc", "vc-b")))] == 2
    assert got[("lucid_hosts", (("state", "draining"),))] == 1
    assert got[("lucid_shared_jobs", (("vc", "vc-a"),))] == got[("lucid_shared_jobs", (("vc", "vc-b"),))] == 0
    assert not any(name == "lucid_shared_speed_min" for name, _ in got)  # nothing shares, nothing measured
    assert got[("lucid_hosts", (("state", "reachable"),))] == 2
    assert got[("lucid_rounds", ())] >= 1 and got[("lucid_rounds_failed", ())] == 0
    assert 100 <= got[("lucid_last_round_age_seconds", ())] < 130
    assert got[("lucid_last_round_decide_seconds", ())] >= 0

    # the shipped alert rules use only metrics this exposition has
    import re

    import yaml

    rules = yaml.safe_load((REPO / "include" / "prometheus" / "lucid_alerts.yml").read_text(encoding="utf-8"))
    exposed = set(re.findall(r"^# TYPE (\w+) ", reply.text, flags=re.M))
    for rule in rules["groups"][0]["rules"]:
        assert rule["alert"] and rule["annotations"]["summary"], rule
        used = set(re.findall(r"\blucid_\w+", rule["expr"]))
        assert used and used <= exposed, (rule["alert"], used - exposed)

    # the CLI prints the same exposition (for node_exporter's textfile collector)
    cli = subprocess.run([sys.executable, "-m", "lucid_core.cli", "metrics", "--store", store.url],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    assert _samples(cli.stdout)[("lucid_queue_jobs", (("vc", "vc-a"),))] == 1

    for job_id in submitted:  # stop the sleeping job before the store goes
        cancel(store, job_id, now=time.time())
    SchedulingRound(store, local_executor(), config, SETTINGS).run()


def test_metrics_of_an_empty_store_are_zero_not_missing(store):
    got = _samples(render(store).decode())
    assert got[("lucid_jobs", (("state", "QUEUED"),))] == 0
    assert got[("lucid_rounds", ())] == 0
    assert not any(name == "lucid_last_round_age_seconds" for name, _ in got)  # no round yet: no age to report
