"""Main runs on an MPS host become MPS clients of one daemon per GPU set, with no change to the job.

No GPU here: real shell processes and real rounds (local executor, emulated telemetry) run the wrapped
commands, and the driver's MPS control binary is a stand-in on PATH that records its calls and the
environment it was started with: `-d` starts a small background process (the "daemon") that lives while
the pipe directory's `control` marker does, `quit` removes the marker, `get_server_list` answers, and
`fault PID` writes a fault line into the daemon's server.log as a real server would on a fatal GPU error.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from runtime_helpers import SETTINGS, fast_config, jobs_by_id, pid_alive, runs_of
from sqlalchemy import select

from lucid_core.runtime.hosts.check import check_host
from lucid_core.runtime.hosts.inventory import HostSpec, add_host
from lucid_core.runtime.hosts.local_executor import local_executor
from lucid_core.runtime.hosts.mps import mps_client_command, parse_fault_read, pinned_limit
from lucid_core.runtime.round.mps_faults import FAULT_REQUEUE_EVENT
from lucid_core.runtime.round.scheduling_round import SchedulingRound
from lucid_core.runtime.store.schema import JobEventRow, JobRow, RunRow
from lucid_core.runtime.store.store import Store
from lucid_core.runtime.surfaces.submission import JobRequest, cancel, submit

STAND_IN = r"""#!/bin/sh
here=$(cd "$(dirname "$0")" && pwd)
pipe=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}
log=${CUDA_MPS_LOG_DIRECTORY:-/var/log/nvidia-mps}
now() { date '+%Y-%m-%d %H:%M:%S.000'; }
if [ "${1:-}" = "-d" ]; then
  echo "start devices=${CUDA_VISIBLE_DEVICES:-} pipe=$pipe marker=${LUCID_RUN_MARKER:-none}" \
    "job=${LUCID_JOB_ID:-none}" >> "$here/calls"
  [ -e "$here/refuse-start" ] && { echo "refused to start (stand-in)" >&2; exit 1; }
  [ -e "$pipe/control" ] && exit 1
  : > "$pipe/control"
  echo "[$(now) Control $$] Starting control daemon (stand-in)" >> "$log/control.log"
  sh -c 'while [ -e "$1/control" ]; do sleep 0.1; done' sh "$pipe" < /dev/null > /dev/null 2>&1 &
  echo $! > "$pipe/daemon.pid"
  exit 0
fi
[ -e "$pipe/control" ] || { echo "Cannot find MPS control daemon process" >&2; exit 1; }
while read -r cmd arg; do
  echo "$cmd pipe=$pipe" >> "$here/calls"
  case "$cmd" in
    get_server_list) echo 4242 ;;
    quit) rm -f "$pipe/control"; echo "[$(now) Control $$] Exiting (stand-in)" >> "$log/control.log" ;;
    fault) echo "[$(now) Server 4242] Client ${arg:-0} hit a fatal GPU exception (stand-in)" >> "$log/server.log" ;;
  esac
done
"""
LIGHT = (12.0, 4.0, 1500.0)  # Tiny by the utilization rule of emulated hosts: two of them pair
PRINT_ENV = "env | grep '^CUDA_' | sort"


@pytest.fixture
def stand_in(tmp_path, monkeypatch) -> Path:
    """The stand-in control binary first on PATH (the local executor's scripts inherit it); its calls file."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-cuda-mps-control"
    fake.write_text(STAND_IN)
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    return bin_dir / "calls"


def _calls(path: Path, word: str) -> list[str]:
    return [c for c in (path.read_text().splitlines() if path.exists() else []) if c.startswith(word)]


def _sh(script: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


# ------------------------------------------------------------------------------ the wrapped command alone
def test_two_clients_share_one_daemon_that_quits_after_the_last(tmp_path, stand_in):
    workdir = str(tmp_path / "runs")
    job = 'echo "$CUDA_VISIBLE_DEVICES|$CUDA_MPS_PIPE_DIRECTORY|${CUDA_MPS_PINNED_DEVICE_MEM_LIMIT:-none}"; sleep {s}'
    first = _sh(mps_client_command(job.replace("{s}", "2"), workdir, [1], "r1", 1535.2))
    time.sleep(0.5)
    second = _sh(mps_client_command(job.replace("{s}", "0.2"), workdir, [1], "r2", None))
    out_second, _ = second.communicate(timeout=30)
    daemon = Path(workdir) / ".mps" / "gpus-1"
    assert (daemon / "pipe" / "control").exists()  # the first client still runs: the daemon stays
    out_first, _ = first.communicate(timeout=30)
    assert first.returncode == 0 and second.returncode == 0
    # GPU 1 is device 0 of the daemon's clients (no nvidia-smi here to name its UUID)
    assert out_first.strip() == f"0|{daemon / 'pipe'}|0=1536M"
    assert out_second.strip() == f"0|{daemon / 'pipe'}|none"  # not profiled yet: no limit guessed
    starts = _calls(stand_in, "start")
    assert len(starts) == 1 and "devices=1 " in starts[0]  # one daemon, for GPU 1 only
    assert not (daemon / "pipe" / "control").exists()  # quit once the last client ended
    assert {oct(p.stat().st_mode & 0o777) for p in (daemon.parent, daemon, daemon / "pipe", daemon / "log")} == {
        "0o700"}


def test_a_killed_clients_daemon_is_quit_by_the_next_launch_and_exit_codes_pass_through(tmp_path, stand_in):
    workdir = str(tmp_path / "runs")
    killed = _sh(mps_client_command("sleep 30", workdir, [0], "r1", None), start_new_session=True)
    daemon = Path(workdir) / ".mps" / "gpus-0"
    for _ in range(100):
        if any((daemon / "clients").glob("*")):
            break
        time.sleep(0.05)
    os.killpg(killed.pid, 9)  # no tidying: its client file and its daemon stay behind
    killed.wait(timeout=10)
    assert (daemon / "pipe" / "control").exists()
    done = subprocess.run(["sh", "-c", mps_client_command("exit 3", workdir, [1], "r2", 100.0)],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 3  # the job's own status
    assert not (daemon / "pipe" / "control").exists()  # GPU 0's daemon, with no client left, was quit
    assert not any((daemon / "clients").glob("*"))


def test_a_daemon_that_cannot_start_fails_the_run_before_the_job_runs(tmp_path):
    no_binary = {**os.environ, "PATH": "/usr/bin:/bin"}
    done = subprocess.run(["sh", "-c", mps_client_command("echo ran", str(tmp_path / "s"), [0], "r2", None)],
                          env=no_binary, capture_output=True, text=True, timeout=60)
    assert done.returncode == 97 and "ran" not in done.stdout
    assert "nvidia-cuda-mps-control is not on PATH" in done.stderr


def test_memory_limits_name_each_visible_device():
    assert pinned_limit(2, 2047.6) == "0=2048M,1=2048M"
    assert pinned_limit(1, None) is None and pinned_limit(1, 0) is None


def test_the_fault_log_is_read_defensively():
    header = "RUN a 1000 1010\nRUN b 1002 1012\nNOW 2000 1970-01-01 01:33:20\nLOGS\n"  # host at UTC+1
    lines = [
        "[1970-01-01 01:16:45.500 Server 4242] Client 77 hit a fatal GPU exception",  # 1005.5: both ran
        "[1970-01-01 01:16:30.000 Server 4242] fatal before b started",  # 990: not while both ran
        "[1970-01-01 01:16:46.000 Control 1] set_default_active_thread_percentage 50",  # "default": no fault
        "garbage fatal fault exception",  # not an MPS log line
        "[1970-01-01 01:16:47.000 Server 4242] fatal " + "x" * 600,  # too long to be the daemon's
        "[1970-13-45 99:99:99.000 Server 4242] fatal",  # no such time
        "RUN b 0 99999",  # after LOGS: the log's text, never the header
    ]
    read = parse_fault_read(header + "\n".join(lines))
    fault = read.fault_ending("b", ("a", "b"))
    assert fault is not None and fault.at == pytest.approx(1005.5) and "Client 77" in fault.line
    assert [f.line for f in read.faults] == lines[1::-1]
    assert read.runs["b"] == (1002.0, 1012.0)
    assert read.fault_ending("b", ("a", "unknown")) is None  # a run whose start is not known: nothing is said
    assert parse_fault_read("RUN a - -\nLOGS\n" + lines[0]).fault_ending("a", ("a",)) is None  # no NOW: no clock


def test_a_run_that_failed_long_after_the_fault_or_a_fault_after_its_partner_ended_is_not_its_partners():
    header = "RUN a 1000 1007\nRUN b 1002 {b_end}\nNOW 2000 1970-01-01 00:33:20\nLOGS\n"
    fault = "[1970-01-01 00:16:45.000 Server 1] Client 7 hit a fatal GPU exception\n"  # 1005
    assert parse_fault_read(header.format(b_end=1020) + fault).fault_ending("b", ("a", "b")) is not None
    late = parse_fault_read(header.format(b_end=4600) + fault)  # b ran on an hour and failed of itself
    assert late.fault_ending("b", ("a", "b")) is None
    after = "[1970-01-01 00:16:55.000 Server 1] Client 7 hit a fatal GPU exception\n"  # 1015: a had ended
    assert parse_fault_read(header.format(b_end=1020) + after).fault_ending("b", ("a", "b")) is None


# ------------------------------------------------------------------------------ live rounds
def _cluster(store: Store, root: Path, sharing: str = "mps") -> None:
    add_host(store, HostSpec("p0", executor="local", pool="profiling", vc="vc-a", telemetry="emulated", gpus=1,
                             workdir=str(root / "p0")))
    add_host(store, HostSpec("m0", executor="local", vc="vc-a", telemetry="emulated", gpus=1, sharing=sharing,
                             workdir=str(root / "m0")))


def _events(store: Store, job_id: str) -> list[JobEventRow]:
    with store.session() as s:
        return list(s.scalars(select(JobEventRow).where(JobEventRow.job_id == job_id)))


def _until(store: Store, done, timeout_s: float = 40.0) -> dict[str, JobRow]:
    deadline = time.monotonic() + timeout_s
    while True:
        SchedulingRound(store, local_executor(), fast_config(), SETTINGS, emulated_profile=lambda job: LIGHT).run()
        jobs = jobs_by_id(store)
        if done(jobs):
            return jobs
        assert time.monotonic() < deadline, {j: (r.state, r.pending_reason) for j, r in jobs.items()}
        time.sleep(0.2)


def _main_runs(store: Store, job_id: str) -> list[RunRow]:
    return [r for r in runs_of(store, job_id) if r.kind == "main"]


def _stdout(root: Path, run: RunRow) -> str:
    return (root / run.host / run.run_id / "stdout.log").read_text()


@pytest.fixture
def live(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    yield store
    (tmp_path / "gate").touch()
    active = [j for j, row in jobs_by_id(store).items() if row.state not in ("COMPLETED", "FAILED", "CANCELLED")]
    for job_id in active:
        cancel(store, job_id)
    try:
        if active:
            _until(store, lambda jobs: all(j.state in ("COMPLETED", "FAILED", "CANCELLED") for j in jobs.values()))
    finally:
        store.dispose()


def _gated(tmp_path: Path, then: str = "exit 0") -> str:
    return f"{PRINT_ENV}; until [ -e {tmp_path / 'gate'} ]; do sleep 0.05; done; {then}"


def test_a_pair_on_an_mps_host_meets_in_one_daemon_with_memory_limits_and_quits_it(live, tmp_path, stand_in):
    _cluster(live, tmp_path / "hosts")
    a = submit(live, JobRequest(_gated(tmp_path), 1, "dana", "vc-a", name="light-a"))
    b = submit(live, JobRequest(_gated(tmp_path), 1, "dana", "vc-a", name="light-b"))
    jobs = _until(live, lambda j: j[a].state == j[b].state == "RUNNING")
    (run_a,), (run_b,) = _main_runs(live, a), _main_runs(live, b)
    assert (run_a.host, run_a.gpu_indices) == (run_b.host, run_b.gpu_indices) == ("m0", [0])
    assert {run_a.partner, run_b.partner} == {a, b}
    daemon = tmp_path / "hosts" / "m0" / ".mps" / "gpus-0"
    headroom = fast_config().binder.memory_headroom_mb
    for job_id, run in ((a, run_a), (b, run_b)):
        for _ in range(50):
            if "CUDA_MPS" in _stdout(tmp_path / "hosts", run):
                break
            time.sleep(0.1)
        env = dict(line.split("=", 1) for line in _stdout(tmp_path / "hosts", run).splitlines())
        assert env["CUDA_MPS_PIPE_DIRECTORY"] == str(daemon / "pipe")
        assert env["CUDA_MPS_LOG_DIRECTORY"] == str(daemon / "log")
        footprint = jobs[job_id].gpu_mem_mb
        assert footprint == pytest.approx(LIGHT[2], rel=0.2)  # the emulated profile's footprint
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == pinned_limit(1, footprint + headroom)
    for run in runs_of(live, a) + runs_of(live, b):  # profiling runs are no clients
        if run.kind == "profiling":
            assert "CUDA_MPS" not in _stdout(tmp_path / "hosts", run)
    [start] = _calls(stand_in, "start")  # started once, by the first; the second joined it
    assert "devices=0 " in start and "marker=none job=none" in start  # never the job's environment
    daemon_pid = int((daemon / "pipe" / "daemon.pid").read_text())
    assert pid_alive(daemon_pid)

    (tmp_path / "gate").touch()
    _until(live, lambda j: j[a].state == j[b].state == "COMPLETED")
    assert len(_calls(stand_in, "start")) == 1 and _calls(stand_in, "quit")
    assert not (daemon / "pipe" / "control").exists() and not any((daemon / "clients").iterdir())
    for _ in range(30):
        if not pid_alive(daemon_pid):
            break
        time.sleep(0.1)
    assert not pid_alive(daemon_pid)


def test_runs_on_a_time_sliced_host_get_no_mps_environment(live, tmp_path, stand_in):
    _cluster(live, tmp_path / "hosts", sharing="time-slice")
    a = submit(live, JobRequest(f"{PRINT_ENV}; sleep 3; echo done", 1, "dana", "vc-a", name="light-a"))
    _until(live, lambda j: j[a].state == "COMPLETED")
    (run,) = _main_runs(live, a)
    out = _stdout(tmp_path / "hosts", run)
    assert "done" in out and "CUDA_MPS" not in out and "CUDA_VISIBLE_DEVICES=0" in out
    assert not stand_in.exists() and not (tmp_path / "hosts" / "m0" / ".mps").exists()


def test_both_runs_an_mps_fault_ended_retry_alone_where_the_culprit_fails_and_its_partner_completes(
        live, tmp_path, stand_in):
    _cluster(live, tmp_path / "hosts")
    culprit_gate, victim_gate, tried = tmp_path / "culprit-gate", tmp_path / "victim-gate", tmp_path / "tried"
    profiling = 'if [ -z "${CUDA_MPS_PIPE_DIRECTORY:-}" ]; then sleep 30; exit 0; fi'  # the profiling run waits
    culprit = (f"{profiling}; until [ -e {culprit_gate} ]; do sleep 0.05; done; "
               "echo \"fault $$\" | nvidia-cuda-mps-control; exit 1")
    victim = (f"{profiling}; if [ -e {tried} ]; then exit 0; fi; : > {tried}; "
              f"until [ -e {victim_gate} ]; do sleep 0.05; done; exit 1")
    c = submit(live, JobRequest(culprit, 1, "dana", "vc-a", name="light-c"))
    v = submit(live, JobRequest(victim, 1, "dana", "vc-a", name="light-v"))
    _until(live, lambda j: j[c].state == j[v].state == "RUNNING")
    assert {r.partner for r in _main_runs(live, c) + _main_runs(live, v)} == {c, v}
    culprit_gate.touch()  # the culprit faults the server and ends: MPS does not say it was the culprit
    _until(live, lambda j: j[c].state == "QUEUED" and j[c].no_share)
    victim_gate.touch()  # its partner dies of the same fault a moment later: it goes back too
    jobs = _until(live, lambda j: j[v].state == "COMPLETED" and j[c].state == "FAILED")
    assert jobs[v].no_share and jobs[c].no_share  # the retries ran alone: neither may share again
    for job in (c, v):
        first, second = _main_runs(live, job)
        assert first.exit_code == 1 and "MPS server fault" in first.outcome and "retries alone" in first.outcome
        assert second.partner is None
        with live.session() as s:
            [event] = s.scalars(select(JobEventRow).where(JobEventRow.job_id == job,
                                                          JobEventRow.kind == FAULT_REQUEUE_EVENT))
        assert "fatal GPU exception" in event.message
    assert _main_runs(live, c)[1].exit_code == 1 and _main_runs(live, v)[1].exit_code == 0  # alone: it fails


def test_a_partner_that_fails_long_after_a_fault_fails_as_usual(live, tmp_path, stand_in, monkeypatch):
    from lucid_core.runtime.hosts import mps

    monkeypatch.setattr(mps, "FAULT_END_WINDOW_S", 0.0)  # "long after": at once, to keep the test short
    _cluster(live, tmp_path / "hosts")
    culprit_gate, victim_gate = tmp_path / "culprit-gate", tmp_path / "victim-gate"
    profiling = 'if [ -z "${CUDA_MPS_PIPE_DIRECTORY:-}" ]; then sleep 30; exit 0; fi'
    culprit = (f"{profiling}; until [ -e {culprit_gate} ]; do sleep 0.05; done; "
               "echo \"fault $$\" | nvidia-cuda-mps-control; exit 1")
    other = f"{profiling}; until [ -e {victim_gate} ]; do sleep 0.05; done; exit 2"
    c = submit(live, JobRequest(culprit, 1, "dana", "vc-a", name="light-c"))
    o = submit(live, JobRequest(other, 1, "dana", "vc-a", name="light-o"))
    _until(live, lambda j: j[c].state == j[o].state == "RUNNING")
    culprit_gate.touch()
    _until(live, lambda j: j[c].state in ("QUEUED", "FAILED"))
    time.sleep(2 * mps.CLOCK_SLACK_S + 1)  # past the window (and the clock's slack)
    victim_gate.touch()
    jobs = _until(live, lambda j: j[o].state == "FAILED")
    assert jobs[o].exit_code == 2 and not jobs[o].no_share
    with live.session() as s:
        assert not s.scalars(select(JobEventRow).where(JobEventRow.job_id == o,
                                                       JobEventRow.kind == FAULT_REQUEUE_EVENT)).all()


def test_a_daemon_that_will_not_start_requeues_the_job_and_cools_the_host_down(live, tmp_path, stand_in):
    from lucid_core.runtime.round.mps_faults import START_RETRY_EVENT
    from lucid_core.runtime.store.schema import HostRow

    _cluster(live, tmp_path / "hosts")
    refuse = stand_in.parent / "refuse-start"
    refuse.touch()
    profiling = 'if [ -z "${CUDA_MPS_PIPE_DIRECTORY:-}" ]; then sleep 30; exit 0; fi'
    job = submit(live, JobRequest(f"{profiling}; echo ran", 1, "dana", "vc-a", name="light-a"))
    _until(live, lambda j: any(e.kind == START_RETRY_EVENT for e in _events(live, job)))
    jobs = jobs_by_id(live)
    assert jobs[job].state == "QUEUED", jobs[job].state  # the host's failure, not the job's
    (first,) = _main_runs(live, job)
    assert first.exit_code == 97 and first.outcome.startswith("the job never started: lucid: MPS:")
    with live.session() as s:
        host = s.get(HostRow, "m0")
        assert host.cooldown_until > time.time() and "did not start" in host.last_error
        host.cooldown_until = None  # the admin fixed the driver
    refuse.unlink()
    _until(live, lambda j: j[job].state == "COMPLETED")
    assert "ran" in _stdout(tmp_path / "hosts", _main_runs(live, job)[-1])


def test_a_job_that_exits_97_itself_fails_as_usual(live, tmp_path, stand_in):
    _cluster(live, tmp_path / "hosts")
    profiling = 'if [ -z "${CUDA_MPS_PIPE_DIRECTORY:-}" ]; then sleep 30; exit 0; fi'
    job = submit(live, JobRequest(f"{profiling}; echo 'lucid: MPS: forged' >&2; echo more >&2; exit 97", 1,
                                  "dana", "vc-a", name="light-a"))
    jobs = _until(live, lambda j: j[job].state in ("FAILED", "QUEUED") and _main_runs(live, job))
    assert jobs[job].state == "FAILED" and jobs[job].exit_code == 97


def test_hosts_check_names_a_missing_mps_control_on_an_mps_host(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    add_host(store, HostSpec("mps0", executor="local", telemetry="emulated", gpus=1, sharing="mps",
                             workdir=str(tmp_path / "mps0")))
    add_host(store, HostSpec("ts0", executor="local", telemetry="emulated", gpus=1, workdir=str(tmp_path / "ts0")))
    report = check_host(store, local_executor(), "mps0")
    items = {i.name: i for i in report.items}
    assert not report.ok and not items["mps-control"].ok and "not on PATH" in items["mps-control"].detail
    assert "FAIL mps-control" in report.describe()
    assert "mps-control" not in {i.name for i in check_host(store, local_executor(), "ts0").items}
    store.dispose()


FAKE_SMI = """#!/bin/sh
case "$*" in
  *mig.mode.current*) printf '0, NVIDIA H100 80GB HBM3, Enabled\\n1, NVIDIA H100 80GB HBM3, Disabled\\n' ;;
  *index,uuid*) printf '0, GPU-aaaa-0000\\n1, GPU-bbbb-1111\\n' ;;
  *) printf '0, NVIDIA H100 80GB HBM3\\n1, NVIDIA H100 80GB HBM3\\n' ;;
esac
"""


def test_hosts_check_shows_the_gpu_model_mig_and_running_daemons(tmp_path, stand_in):
    smi = stand_in.parent / "nvidia-smi"
    smi.write_text(FAKE_SMI)
    smi.chmod(0o755)
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    add_host(store, HostSpec("mps0", executor="local", telemetry="nvml", gpus=2, sharing="mps",
                             gpu_model="NVIDIA H200", workdir=str(tmp_path / "mps0")))
    # a client on GPU 1: with nvidia-smi, the daemon and the client name the GPU by its UUID
    client = _sh(mps_client_command('echo "$CUDA_VISIBLE_DEVICES"; sleep 3', str(tmp_path / "mps0"), [1], "r1", None))
    daemon = tmp_path / "mps0" / ".mps" / "gpus-1"
    for _ in range(100):
        if any((daemon / "clients").glob("*")):
            break
        time.sleep(0.05)
    items = {i.name: i for i in check_host(store, local_executor(), "mps0").items}
    out, _ = client.communicate(timeout=30)
    assert out.strip() == "GPU-bbbb-1111" and "devices=GPU-bbbb-1111 " in _calls(stand_in, "start")[0]
    assert items["nvidia-smi"].ok and items["nvidia-smi"].detail == "2 GPU(s): NVIDIA H100 80GB HBM3"
    assert items["gpu-model"].warn and "the store says NVIDIA H200" in items["gpu-model"].detail
    assert items["mig"].ok and items["mig"].warn and "GPU(s) 0" in items["mig"].detail
    assert "sharing by mps is not what this host does" in items["mig"].detail
    assert items["mps-control"].ok and items["flock"].ok
    assert "running for gpus-1" in items["mps-daemon"].detail
    store.dispose()


def test_on_a_submitter_host_a_users_daemons_live_on_the_hosts_disk_in_a_directory_of_their_own(tmp_path, stand_in):
    home = tmp_path / "home-of-dana"
    home.mkdir()
    command = mps_client_command('echo "$CUDA_MPS_PIPE_DIRECTORY"', "/srv/lucid-runs-of-the-account", [0], "r1",
                                 None, as_submitter=True)
    done = subprocess.run(["sh", "-c", command], env={**os.environ, "HOME": str(home)}, capture_output=True,
                          text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    root = Path(f"/tmp/lucid-mps-{os.getuid()}")
    assert done.stdout.strip() == str(root / "gpus-0" / "pipe")
    assert oct(root.stat().st_mode & 0o777) == "0o700" and root.stat().st_uid == os.getuid()


@pytest.mark.parametrize("reader_tz", [None, "America/New_York", "Asia/Kolkata"])
def test_fault_times_are_read_on_the_daemons_clock_whatever_the_readers_tz(tmp_path, reader_tz):
    """The daemon runs with a clean environment (no TZ), so its log is in the host's zone; the reader's shell may
    carry another TZ (an SSH session's, a container's): the fault must be placed right either way."""
    from lucid_core.runtime.hosts.mps import fault_read_script

    workdir = tmp_path / "w"
    log = workdir / ".mps" / "gpus-0" / "log"
    log.mkdir(parents=True)
    for run in ("ra", "rb"):
        (workdir / run).mkdir()
        (workdir / run / "pid").write_text("1\n")
    old = time.time() - 20
    for run in ("ra", "rb"):
        os.utime(workdir / run / "pid", (old, old))
    stamp = subprocess.run(["env", "-i", "date", "+%Y-%m-%d %H:%M:%S"], capture_output=True, text=True,
                           check=True).stdout.strip()  # as the daemon writes it
    (log / "server.log").write_text(f"[{stamp}.000 Server 4242] Client 77 hit a fatal GPU exception\n")
    for run in ("ra", "rb"):
        (workdir / run / "exit_code").write_text("1\n")
    env = {k: v for k, v in os.environ.items() if k != "TZ"} | ({"TZ": reader_tz} if reader_tz else {})
    out = subprocess.run(["sh", "-c", fault_read_script(str(workdir), [0], ["ra", "rb"])], env=env,
                         capture_output=True, text=True, timeout=30).stdout
    read = parse_fault_read(out)
    assert [abs(f.at - time.time()) < 10 for f in read.faults] == [True], (out, read)
    assert read.fault_ending("rb", ("ra", "rb")) is not None
