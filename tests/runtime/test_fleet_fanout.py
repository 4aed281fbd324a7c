"""Host calls of a round fan out: a silent host and a slow host (real sshd behind a delaying link) do not
delay the launches on the other hosts of the same round, the silent host costs the round one deadline, and
its jobs, whose launches never reached it, wait again for hosts that answer. Jobs write the time they started
into a ledger on the host side, so "not delayed" is read from what really started, not from the store."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from loopback_fleet import DelayedLink, SilentPort, SshdFleet, sshd_available
from runtime_helpers import SETTINGS, fast_config, jobs_by_id
from sqlalchemy import select

from lucid_core.runtime.hosts.calls import GRACE_S, CallResult, HostCall, HostCallPool
from lucid_core.runtime.hosts.inventory import HostSpec, add_host
from lucid_core.runtime.hosts.ssh_executor import ssh_executor
from lucid_core.runtime.round.scheduling_round import SchedulingRound
from lucid_core.runtime.store.schema import HostRow, RunRow
from lucid_core.runtime.store.store import Store
from lucid_core.runtime.surfaces.submission import JobRequest, cancel, submit

pytestmark = pytest.mark.ssh
DEADLINE_S = 6.0
FAST_HOSTS = ("fast0", "fast1", "fast2")


@pytest.fixture
def fleet(tmp_path):
    if not sshd_available():
        pytest.skip("openssh-server not installed: apt-get install openssh-server")
    servers = SshdFleet(tmp_path / "sshd", servers=1).start()
    silent = SilentPort()
    slow = DelayedLink(servers.ports[0], delay_s=0.05)
    servers.write_known_hosts({slow.port: 0})
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    ports = {**{name: servers.ports[0] for name in FAST_HOSTS}, "slow0": slow.port, "silent0": silent.port}
    for name, port in ports.items():
        add_host(store, HostSpec(name, port=port, user=servers.user, key_path=str(servers.client_key), vc="vc-a",
                                 pool="main", executor="ssh", telemetry="emulated",
                                 workdir=str(tmp_path / "hosts" / name), gpus=2))
    yield store, servers, tmp_path
    silent.close()  # refused from now on: the cleanup round does not wait for it
    for job_id, row in jobs_by_id(store).items():
        if row.state not in ("COMPLETED", "FAILED", "CANCELLED"):
            cancel(store, job_id)
    executor = ssh_executor(str(servers.known_hosts), connect_timeout_s=DEADLINE_S, timeout_s=DEADLINE_S)
    SchedulingRound(store, executor, fast_config(), replace(SETTINGS, host_call_deadline_s=DEADLINE_S)).run()
    store.dispose()
    slow.close()
    servers.stop()


def started_at(ledger: Path) -> dict[str, float]:
    """Job id -> when its process started, from the ledger the jobs append to."""
    out = {}
    for line in ledger.read_text().splitlines() if ledger.exists() else []:
        job_id, when = line.split()
        out.setdefault(job_id, float(when))
    return out


def test_silent_and_slow_hosts_do_not_delay_launches_elsewhere(fleet):
    store, servers, root = fleet
    ledger = root / "ledger"
    # no idle probes: the silent host went silent after its last one, so this round places work there
    settings = replace(SETTINGS, host_call_deadline_s=DEADLINE_S, host_lost_after_s=0.5, host_parallelism=8,
                       idle_probe_s=None)
    for i in range(10):
        submit(store, JobRequest(f'echo "$LUCID_JOB_ID $(date +%s.%N)" >> {ledger}; sleep 30', 1, "u", "vc-a",
                                 name=f"j{i}"))
    executor = ssh_executor(str(servers.known_hosts), connect_timeout_s=DEADLINE_S, timeout_s=DEADLINE_S)
    began = time.time()
    report = SchedulingRound(store, executor, fast_config(), settings, close_executor=False).run()
    took = time.time() - began
    with store.session() as s:
        placed = {r.job_id: r.host for r in s.scalars(select(RunRow))}
    assert set(placed.values()) >= {*FAST_HOSTS, "slow0", "silent0"}, placed  # every host got work this round
    assert report.unreachable == ["silent0"], report
    # the silent host cost the round its deadline once (launches there are one batch), not once per call
    assert DEADLINE_S <= took < 2 * DEADLINE_S + 2, took
    starts = started_at(ledger)
    for job_id, host in placed.items():
        if host in FAST_HOSTS:
            # started before the silent host's launch was given up: nothing waited for it
            assert starts[job_id] - began < DEADLINE_S, (job_id, starts[job_id] - began)
    slow_jobs = [j for j, h in placed.items() if h == "slow0"]
    assert slow_jobs and all(j in starts for j in slow_jobs)  # slow, but launched in the same round
    assert {j for j, h in placed.items() if h == "silent0"}.isdisjoint(starts)
    with store.session() as s:
        assert s.get(HostRow, "silent0").reachable is False
        assert s.get(HostRow, "slow0").reachable is True

    # its launches never reached it (no SSH session): nothing started there, so its jobs wait again at once
    silent_jobs = [j for j, h in placed.items() if h == "silent0"]
    assert sorted(report.requeued) == sorted(silent_jobs), report
    with store.session() as s:
        outcomes = [r.outcome for r in s.scalars(select(RunRow).where(RunRow.host == "silent0"))]
    assert all(o.startswith("not launched: host silent0 did not answer") for o in outcomes), outcomes
    # next rounds: the silent host still costs one deadline a round (its probe) and gets no work; its jobs are
    # neither lost nor failed (the loss timeout passes meanwhile): they wait for GPUs on hosts that answer
    for _ in range(2):
        began = time.time()
        report = SchedulingRound(store, executor, fast_config(), settings, close_executor=False).run()
        assert time.time() - began < DEADLINE_S + 4, report
        assert report.unreachable == ["silent0"], report
    states = jobs_by_id(store)
    assert {states[j].state for j in silent_jobs} <= {"QUEUED", "RUNNING"}, {j: states[j].state for j in silent_jobs}
    with store.session() as s:
        assert s.scalar(select(RunRow.run_id).where(RunRow.host == "silent0", RunRow.state != "ended")) is None
    assert all(states[j].state not in ("FAILED",) for j in placed)
    # one connection per answering host, kept across the rounds of this process (silent0 never connects)
    assert executor.transports["ssh"].connects == len(FAST_HOSTS) + 1
    executor.close()


def test_pool_gives_up_a_batch_past_its_deadline_and_skips_the_host_after():
    """A call that never returns (a stuck worker) is given up at its deadline; the host is skipped after."""
    gave_up, release = [], threading.Event()
    pool = HostCallPool(4, give_up=gave_up.append)
    stuck = HostCall(lambda: release.wait(30), deadline_s=0.5)
    quick = HostCall(lambda: "ok", deadline_s=0.5)
    began = time.monotonic()
    results = pool.run({"hung": [stuck, quick], "fine": [quick, quick]})
    assert time.monotonic() - began < 2 * 0.5 + GRACE_S + 0.5  # the batch's two deadlines and the grace
    assert [r.value for r in results["fine"]] == ["ok", "ok"]
    assert all(not r.ok for r in results["hung"]) and gave_up == ["hung"]
    again = pool.run({"hung": [quick]})
    assert isinstance(again["hung"][0], CallResult) and not again["hung"][0].ok
    assert pool.calls == 3  # the hung host's second call and its later batch were never made
    release.set()
    pool.close()


class _StallingDown(dict):
    """The pool's `down` map, whose worker-side write stalls (the worker losing the CPU right after it)."""

    def setdefault(self, key, value):
        found = super().setdefault(key, value)
        if threading.current_thread() is not threading.main_thread():
            time.sleep(GRACE_S + 1.5)
        return found


def test_a_batch_given_up_says_its_calls_may_have_reached_the_host():
    """A launch that returned, then a later call of the batch that never reached the host, its worker stalled
    past the batch's budget: the given-up batch's results say every call may have reached the host, not the
    later call's 'never reached' (which would end a run that is running)."""
    from lucid_core.runtime.hosts.executor import HostUnreachable

    def refused() -> str:
        time.sleep(0.3)
        raise HostUnreachable("host h: connection refused", reached=False)

    pool = HostCallPool(2)
    pool.down = _StallingDown()
    try:
        out = pool.run({"h": [HostCall(lambda: "launched", 0.5), HostCall(refused, 0.5)]}, limit_s=0.5)
    finally:
        pool.close()
    assert [r.ok for r in out["h"]] == [False, False]
    assert all(r.error.reached for r in out["h"]), [(r.error, r.error.reached) for r in out["h"]]


def test_round_every_keeps_each_host_connection_across_rounds(sshd_hosts, tmp_path, monkeypatch):
    """`lucid round --every` makes one executor for its loop: a host called in several rounds is connected once."""
    from runtime_helpers import register

    from lucid_core.cli import main as lucid
    from lucid_core.runtime.hosts import ssh_executor as ssh_module
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    register(store, sshd_hosts, tmp_path / "hosts")
    job = submit(store, JobRequest("sleep 20", 1, "u", "vc-a", name="long"))
    config = tmp_path / "lucid.toml"
    config.write_text('[profiler]\ntprof_s = 1\nin_place = false\n[runtime]\nstop_grace_s = 1\n', encoding="utf-8")
    made = []
    real = ssh_module.ssh_executor
    monkeypatch.setattr(ssh_module, "ssh_executor", lambda *a, **k: made.append(real(*a, **k)) or made[-1])
    monkeypatch.setenv("LUCID_KNOWN_HOSTS", str(sshd_hosts.known_hosts))
    args = ["round", "--store", store.url, "--every", "0.5s", "--rounds", "4", "--lucid-config", str(config)]
    assert lucid(args) == 0
    with store.session() as s:
        called = {r.host for r in s.scalars(select(RunRow).where(RunRow.job_id == job))}
    assert len(made) == 1 and called, (made, called)  # one executor for the loop, and hosts had work
    # each host connected once over four rounds (the idle ones too: the first round probes hosts never heard from)
    assert made[0].transports["ssh"].connects == len(sshd_hosts.hosts)
    cancel(store, job)
    assert lucid(["round", "--store", store.url, "--lucid-config", str(config)]) == 0
    assert jobs_by_id(store)[job].state == "CANCELLED"
    store.dispose()
