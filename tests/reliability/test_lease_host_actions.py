"""A round fenced *between* renewing its lease and its host action: the action still reaches the host.

The lease fences store writes; a launch is a host side effect. Round A renews its lease for a launch,
then stalls before the command reaches the host (a paused VM, a slow SSH connect) past its TTL. The job
is cancelled meanwhile; round B takes the lease over, ends the planned run ("cancelled before launch"),
cancels the job and gives its GPU to the next job. A then goes on: its launch must not leave a run on the
host that the store does not know (it would hold a GPU the store sees free). A stops what it launched
once it finds itself fenced and the run no longer expected; until then the two runs overlap on the GPU,
which only the host can refuse (the launch script's check of live runs on a GPU). Real processes: A is a
`lucid round` child, jobs are local processes writing a ledger on their host.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from runtime_helpers import jobs_by_id
from sqlalchemy import select
from test_lease_fencing import HERE, _env, ledger_job

from lucid_core.config import load_config
from lucid_core.runtime.hosts.inventory import HostSpec, add_host, host_address
from lucid_core.runtime.hosts.local_executor import local_executor
from lucid_core.runtime.round.scheduling_round import RoundSettings, SchedulingRound
from lucid_core.runtime.store.schema import HostRow, RunRow
from lucid_core.runtime.store.store import Store
from lucid_core.runtime.surfaces.submission import JobRequest, cancel, submit


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_launch_stalled_past_the_lease_leaves_no_untracked_run(tmp_path, backend, request):
    store = (Store(f"sqlite:///{tmp_path / 'lucid.db'}") if backend == "sqlite"
             else request.getfixturevalue("fresh_pg_store"))
    for name, pool in (("p0", "profiling"), ("m0", "main")):  # one main GPU: the cancelled job's
        add_host(store, HostSpec(name, executor="local", pool=pool, vc="vc-a", telemetry="emulated", gpus=1,
                                 workdir=str(tmp_path / "hosts" / name)))
    ledger = tmp_path / "ledger"
    env = _env(tmp_path, ttl_s=30)
    config = load_config(env["LUCID_CONFIG"])

    def in_process_round() -> None:
        SchedulingRound(store, local_executor(), config, RoundSettings.from_config(config, holder="setup")).run()

    deadline = time.monotonic() + 180
    release = tmp_path / "release"  # the blocker holds m0 until the set-up is done (not a guessed sleep)
    holding = (f'echo "S $LUCID_JOB_ID $LUCID_RUN_ID $CUDA_VISIBLE_DEVICES $PWD $(date +%s.%N)" >> {ledger}; '
               f'while [ ! -e {release} ]; do sleep 0.1; done; echo "E $LUCID_JOB_ID $LUCID_RUN_ID $(date +%s.%N)" '
               f'>> {ledger}')
    blocker = submit(store, JobRequest(holding, 1, "u", "vc-a", name="block"))
    while jobs_by_id(store)[blocker].state != "RUNNING":
        in_process_round()
        assert time.monotonic() < deadline, {j: r.state for j, r in jobs_by_id(store).items()}
        time.sleep(0.2)
    victim = submit(store, JobRequest(ledger_job(ledger, 8), 1, "u", "vc-a", name="victim"))
    successor = submit(store, JobRequest(ledger_job(ledger, 3), 1, "u", "vc-a", name="successor"))
    while not all(jobs_by_id(store)[j].state == "QUEUED" for j in (victim, successor)):
        in_process_round()
        assert time.monotonic() < deadline, {j: r.state for j, r in jobs_by_id(store).items()}
        time.sleep(0.2)
    release.touch()
    while not any(line.startswith("E ") and line.split()[1] == blocker for line in ledger.read_text().splitlines()):
        assert time.monotonic() < deadline
        time.sleep(0.2)

    # A (TTL 2 s) settles the blocker, places the victim on m0, renews its lease and stalls in the launch
    go = tmp_path / "go"
    slow = subprocess.Popen([sys.executable, str(HERE / "stall_launch_child.py"), store.url, str(go)],
                            env=_env(tmp_path, ttl_s=2), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while "STALLED" not in (line := slow.stderr.readline()):
        assert line, "the slow round ended before its launch: " + slow.stderr.read()[-2000:]
    assert victim in line, line
    cancel(store, victim)
    time.sleep(2.5)  # A's lease lapses
    in_process_round()  # B: the victim's planned run ends before launch, the successor gets m0's GPU
    assert jobs_by_id(store)[victim].state == "CANCELLED"
    go.touch()
    out, err = slow.communicate(timeout=60)
    # A was fenced when it wrote after its late launch, or (the host's ledger of live runs) its launch was
    # refused on the GPU the successor now holds, and it wrote nothing: either way no untracked run (below)
    assert slow.returncode == 4 or (slow.returncode == 0 and "refused run" in out), (out, err[-2000:])
    with store.session() as s:
        run_id = s.scalar(select(RunRow.run_id).where(RunRow.job_id == victim, RunRow.kind == "main"))
        host = host_address(s.get(HostRow, "m0"))
    # the host's own view right after A ended: no live run of the cancelled job (it would hold m0's GPU
    # while the store sees it free, and run its 8 s to the end)
    status = local_executor().poll(host, [run_id]).get(run_id)
    assert status is None or status.state != "RUNNING", f"{run_id} still runs on m0 behind the store's back"
    while jobs_by_id(store)[successor].state not in ("COMPLETED", "FAILED"):
        in_process_round()
        assert time.monotonic() < deadline + 60, {j: r.state for j, r in jobs_by_id(store).items()}
        time.sleep(0.3)
    assert jobs_by_id(store)[victim].state == "CANCELLED"
    time.sleep(1.0)
    ended = {line.split()[2] for line in ledger.read_text().splitlines() if line.startswith("E ")}
    assert run_id not in ended, "the cancelled job's run was left to finish on the host"
    store.dispose()
