"""Hosts that run each job as its submitter (`run_as="submitter"`), over a real sshd on loopback.

The set-up makes real OS users: an SSH account that is not root (`lucidt-svc`, what the scheduler logs
in as), two people in a `lucidt-users` group (`lucidt-a`, `lucidt-b`) and one outside it
(`lucidt-out`), plus a sudoers drop-in with the line the README documents, all removed afterwards.
Needs root (useradd, sudoers), sudo and openssh-server; skipped with the reason printed otherwise.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from runtime_helpers import fast_config, jobs_by_id, marked_processes, runs_of
from sqlalchemy import select

from lucid_core.domain import JobState
from lucid_core.runtime.hosts.inventory import HostSpec, add_host
from lucid_core.runtime.hosts.run_records import RUN_MARKER
from lucid_core.runtime.hosts.ssh_executor import ssh_executor
from lucid_core.runtime.round.scheduling_round import RoundReport, RoundSettings, SchedulingRound
from lucid_core.runtime.store.schema import HostRow, JobEventRow
from lucid_core.runtime.store.store import Store
from lucid_core.runtime.surfaces.queries import logs
from lucid_core.runtime.surfaces.submission import JobRequest, SubmissionError, cancel, submit

# every test of this module on one xdist worker (`scripts/test.sh` runs with --dist loadgroup): they share OS users
pytestmark = [pytest.mark.ssh, pytest.mark.xdist_group("run_as")]

SSHD = "/usr/sbin/sshd"
SERVICE, USER_A, USER_B, OUTSIDER, GROUP = "lucidt-svc", "lucidt-a", "lucidt-b", "lucidt-out", "lucidt-users"
BARE_SERVICE = "lucidt-bare"  # an SSH account with no sudoers line: its host refuses every user
SUDOERS_DROP_IN = Path("/etc/sudoers.d/lucid-test-run-as")
# held from making the OS users to removing them: the users are the machine's, so two pytest processes (xdist
# workers without --dist loadgroup, two runs at once) each dropping and making them again killed the other's sshd
# sessions and replaced its authorized key: its host stayed unreachable until its tests timed out
USERS_LOCK = Path("/tmp/lucid-test-run-as.lock")
# the line include/airflow/README.md documents, for this test's account and group
SUDOERS_LINE = f"{SERVICE} ALL=(%{GROUP}) NOPASSWD: /bin/sh\n"
TERMINAL = {s.value for s in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)}
SETTINGS = RoundSettings(stop_grace_s=1.0, launch_grace_s=30, lease_ttl_s=5, holder="run-as-test")


@dataclass
class SubmitterHost:
    """One sshd on 127.0.0.1 whose jobs run as their submitter; the scheduler logs in as SERVICE."""

    port: int
    client_key: Path
    known_hosts: Path
    home: Path  # SERVICE's home, where each test's run directories go


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True, check=False)


def _drop_users() -> None:
    """Kill the test users' processes, wait until none is left (userdel refuses a busy account, and a process
    still writing in a home keeps `userdel -r` from removing it), then remove the users, their homes and group."""
    names = (USER_A, USER_B, OUTSIDER, SERVICE, BARE_SERVICE)
    homes = []
    for name in names:
        with contextlib.suppress(KeyError):
            homes.append(Path(pwd.getpwnam(name).pw_dir))
    deadline = time.monotonic() + 15
    while any(_run("pgrep", "-r", "R,S,D,T,t,W", "-u", name).returncode == 0 for name in names if _known_user(name)):
        for name in names:
            _run("pkill", "-KILL", "-u", name)
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    for name in names:
        _run("userdel", "-r", name)
    for home in homes:  # what userdel -r could not remove (a file made while it ran)
        if home.is_dir() and home.parent == Path("/home"):
            shutil.rmtree(home, ignore_errors=True)
    _run("groupdel", GROUP)
    SUDOERS_DROP_IN.unlink(missing_ok=True)


def _known_user(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_port(port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"sshd did not listen on {port}")


@pytest.fixture(scope="module")
def submitter_host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SubmitterHost]:
    missing = [tool for tool in ("sudo", "useradd", "groupadd", "visudo", "ssh-keygen") if shutil.which(tool) is None]
    if os.geteuid() != 0:
        pytest.skip("creating OS users and a sudoers drop-in needs root")
    if missing or not os.path.exists(SSHD):
        pytest.skip(f"missing {', '.join(missing + ([] if os.path.exists(SSHD) else [SSHD]))}: "
                    "apt-get install sudo openssh-server")
    lock = USERS_LOCK.open("a")
    fcntl.flock(lock, fcntl.LOCK_EX)  # released with the file at the end (or when this process dies)
    try:
        _drop_users()  # what an interrupted earlier run may have left
        for argv in (("groupadd", GROUP),
                     ("useradd", "-m", "-s", "/bin/sh", "-p", "*", SERVICE),
                     ("useradd", "-m", "-s", "/bin/sh", "-p", "*", BARE_SERVICE),
                     ("useradd", "-m", "-s", "/bin/sh", "-p", "*", "-G", GROUP, USER_A),
                     ("useradd", "-m", "-s", "/bin/sh", "-p", "*", "-G", GROUP, USER_B),
                     ("useradd", "-m", "-s", "/bin/sh", "-p", "*", OUTSIDER)):
            done = _run(*argv)
            assert done.returncode == 0, f"{argv}: {done.stderr}"
        root = tmp_path_factory.mktemp("run_as")
        staged = root / "sudoers"
        staged.write_text(SUDOERS_LINE)
        checked = _run("visudo", "-cf", str(staged))
        assert checked.returncode == 0, checked.stdout + checked.stderr
        shutil.copyfile(staged, SUDOERS_DROP_IN)
        SUDOERS_DROP_IN.chmod(0o440)
        process = None
        try:
            service = pwd.getpwnam(SERVICE)
            client_key = root / "client_ed25519"
            host_key = root / "host_ed25519"
            for key in (client_key, host_key):
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
            # sshd reads authorized_keys as the user logging in: it lives in each account's home
            for account in (service, pwd.getpwnam(BARE_SERVICE)):
                ssh_dir = Path(account.pw_dir) / ".ssh"
                ssh_dir.mkdir(mode=0o700)
                (ssh_dir / "authorized_keys").write_text(Path(f"{client_key}.pub").read_text())
                for path in (ssh_dir, ssh_dir / "authorized_keys"):
                    os.chown(path, account.pw_uid, account.pw_gid)
            port = _free_port()
            config = root / "sshd.conf"
            config.write_text("\n".join([
                f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {host_key}", f"PidFile {root / 'sshd.pid'}",
                "AuthorizedKeysFile .ssh/authorized_keys", "UsePAM no", "PasswordAuthentication no",
                "KbdInteractiveAuthentication no", "PubkeyAuthentication yes", f"AllowUsers {SERVICE} {BARE_SERVICE}",
                "MaxSessions 50", "MaxStartups 50", "LogLevel ERROR", "",
            ]))
            known_hosts = root / "known_hosts"
            kind, blob = Path(f"{host_key}.pub").read_text().split()[:2]
            known_hosts.write_text(f"[127.0.0.1]:{port} {kind} {blob}\n")
            Path("/run/sshd").mkdir(parents=True, exist_ok=True)
            process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            _wait_port(port)
            yield SubmitterHost(port, client_key, known_hosts, Path(service.pw_dir))
        finally:
            if process is not None:
                process.kill()
                process.wait(timeout=10)
            _drop_users()
    finally:
        lock.close()


@pytest.fixture
def run_root(submitter_host: SubmitterHost, tmp_path: Path) -> Path:
    """This test's run directories on the host (job ids repeat from one test's store to the next)."""
    return submitter_host.home / tmp_path.name


@pytest.fixture
def store(submitter_host: SubmitterHost, run_root: Path, tmp_path: Path) -> Iterator[Store]:
    """A store with one host, `sub0` in VC vc-u, that runs each job as its submitter."""
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    add_host(store, HostSpec("sub0", address="127.0.0.1", port=submitter_host.port, user=SERVICE,
                             key_path=str(submitter_host.client_key), vc="vc-u", executor="ssh",
                             telemetry="emulated", gpus=2, run_as="submitter", workdir=f"~/{run_root.name}"))
    yield store
    store.dispose()


CONFIG = fast_config(**{"profiler.enabled": False, "cluster.gpus_per_node": 2})  # 2-GPU hosts: 4 GPUs span two


def one_round(store: Store, host: SubmitterHost) -> RoundReport:
    executor = ssh_executor(str(host.known_hosts), connect_timeout_s=2, retries=1, timeout_s=20)
    return SchedulingRound(store, executor, CONFIG, SETTINGS).run()


def rounds_until(store: Store, host: SubmitterHost, done, timeout_s: float = 30.0):
    deadline = time.monotonic() + timeout_s
    while True:
        report = one_round(store, host)
        jobs = jobs_by_id(store)
        if done(jobs):
            return jobs
        assert time.monotonic() < deadline, ({j: (r.state, r.pending_reason, r.end_reason) for j, r in jobs.items()},
                                             report.errors, report.unreachable)
        time.sleep(0.2)


def group_processes(pgid: int) -> list[tuple[int, str, str]]:
    """(pid, user, command) of the live processes in a process group."""
    out = _run("ps", "-e", "-o", "pid=,pgid=,stat=,user:32=,args=").stdout
    found = []
    for line in out.splitlines():
        pid, group, stat, user, args = line.split(None, 4)
        if int(group) == pgid and not stat.startswith("Z"):
            found.append((int(pid), user, args))
    return found


def as_user(user: str, command: str) -> subprocess.CompletedProcess[str]:
    return _run("sudo", "-n", "-u", user, "--", "/bin/sh", "-c", command)


def test_a_job_runs_as_its_submitter_its_log_comes_back_and_cancel_kills_it(store, submitter_host, run_root):
    job = submit(store, JobRequest(
        # a child that ignores TERM too: cancel must still leave nothing of the job behind
        "echo whoami=$(id -un) home=$HOME secret=$SECRET; sh -c 'trap \"\" TERM; exec sleep 301' & sleep 300",
        1, USER_A, "vc-u", env={"SECRET": "s3 cr$t"}))
    jobs = rounds_until(store, submitter_host, lambda jobs: jobs[job].state == "RUNNING" and runs_of(store, job)
                        and runs_of(store, job)[-1].pid is not None)
    run = runs_of(store, job)[-1]
    processes: list[tuple[int, str, str]] = []
    deadline = time.monotonic() + 10
    while not any("sleep 300" in args for _, _, args in processes):
        assert time.monotonic() < deadline, processes
        time.sleep(0.1)
        processes = group_processes(run.pid)
    by_command = {args: (pid, user) for pid, user, args in processes}
    assert by_command["sleep 300"][1] == USER_A and by_command["sleep 301"][1] == USER_A, processes
    assert Path(f"/proc/{by_command['sleep 300'][0]}").stat().st_uid == pwd.getpwnam(USER_A).pw_uid
    assert [user for pid, user, _ in processes if pid == run.pid] == [SERVICE]  # the wrapper stays the account's

    deadline = time.monotonic() + 10
    while "whoami" not in (text := logs(store, ssh_executor(str(submitter_host.known_hosts)), job).text):
        assert time.monotonic() < deadline, text
        time.sleep(0.2)
    assert f"whoami={USER_A} home={pwd.getpwnam(USER_A).pw_dir} secret=s3 cr$t" in text

    run_dir = run_root / run.run_id
    for other in (USER_B, USER_A):  # another person (or the job's own user) cannot read the run files
        assert as_user(other, f"cat {run_dir}/stdout.log").returncode != 0
    sleeper = by_command["sleep 300"][0]
    assert as_user(USER_B, f"kill -s 0 {sleeper}").returncode != 0  # nor signal the job
    assert as_user(USER_A, f"kill -s 0 {sleeper}").returncode == 0  # its own user can

    cancel(store, job)
    jobs = rounds_until(store, submitter_host, lambda jobs: jobs[job].state in TERMINAL)
    assert jobs[job].state == "CANCELLED", jobs[job].end_reason
    deadline = time.monotonic() + 5
    while group_processes(run.pid):
        assert time.monotonic() < deadline, group_processes(run.pid)
        time.sleep(0.1)


def users_processes(marker: str, user: str) -> dict[int, int]:
    """The marked processes owned by `user` (the job's own; its wrapper and sudo, the account's, carry the
    marker too, from their start)."""
    uid = pwd.getpwnam(user).pw_uid
    found = {}
    for pid, group in marked_processes(marker).items():
        try:
            if Path(f"/proc/{pid}").stat().st_uid == uid:
                found[pid] = group
        except OSError:
            continue
    return found


def test_cancel_kills_the_submitters_processes_that_left_the_group_and_not_another_users_job(
        store, submitter_host, run_root):
    """The stop finds the escaped process (a `setsid` child, owned by the job's user) by the run marker,
    scanning as that user through sudo; user B's job beside it, with its own escaped child, runs on."""
    victim = submit(store, JobRequest("setsid sleep 310 & sleep 311", 1, USER_A, "vc-u"))
    bystander = submit(store, JobRequest("setsid sleep 312 & sleep 313", 1, USER_B, "vc-u"))
    rounds_until(store, submitter_host, lambda jobs: all(
        jobs[j].state == "RUNNING" and runs_of(store, j)[-1].pid is not None for j in (victim, bystander)))
    marked: dict[str, tuple[str, dict[int, int]]] = {}
    for job_id, user in ((victim, USER_A), (bystander, USER_B)):
        run = runs_of(store, job_id)[-1]
        marker = f"{RUN_MARKER}=" + (run_root / run.run_id / "marker").read_text().strip()
        deadline = time.monotonic() + 10
        found = users_processes(marker, user)
        while len(found) < 2:  # both sleeps, one of them (the setsid child) out of the group
            assert time.monotonic() < deadline, (job_id, found)
            time.sleep(0.1)
            found = users_processes(marker, user)
        assert sorted(group == run.pid for group in found.values()) == [False, True], (job_id, run.pid, found)
        marked[job_id] = (marker, found)
    escaped = [pid for pid, group in marked[victim][1].items() if group != runs_of(store, victim)[-1].pid]
    assert Path(f"/proc/{escaped[0]}").stat().st_uid == pwd.getpwnam(USER_A).pw_uid

    cancel(store, victim)
    jobs = rounds_until(store, submitter_host, lambda jobs: jobs[victim].state in TERMINAL)
    assert jobs[victim].state == "CANCELLED", jobs[victim].end_reason
    assert marked_processes(marked[victim][0]) == {}, "a process of the cancelled run is left"
    assert "killed 1 of its processes that had left its process group" in runs_of(store, victim)[-1].outcome
    assert users_processes(marked[bystander][0], USER_B) == marked[bystander][1], "the stop touched user B's job"
    cancel(store, bystander)
    rounds_until(store, submitter_host, lambda jobs: jobs[bystander].state in TERMINAL)
    assert marked_processes(marked[bystander][0]) == {}


def test_a_user_the_host_refuses_fails_the_job_with_the_reason_once(store, submitter_host, run_root):
    ghost = submit(store, JobRequest("echo never", 1, "lucidt-ghost", "vc-u"))  # no such OS user
    outsider = submit(store, JobRequest("echo never", 1, OUTSIDER, "vc-u"))  # exists, sudo does not allow it
    jobs = rounds_until(store, submitter_host, lambda jobs: all(jobs[j].state in TERMINAL for j in (ghost, outsider)))
    for job_id, user, said in ((ghost, "lucidt-ghost", "unknown user"), (outsider, OUTSIDER, "password is required")):
        row = jobs[job_id]
        assert row.state == "FAILED" and row.attempts == 1, (row.state, row.attempts, row.end_reason)
        assert f"host sub0 cannot run the job as user '{user}'" in row.end_reason and said in row.end_reason
        with store.session() as s:
            kinds = [e.kind for e in s.scalars(select(JobEventRow).where(JobEventRow.job_id == job_id))]
        assert kinds.count("failed") == 1 and kinds[-1] == "failed", kinds
        assert all(r.state == "ended" for r in runs_of(store, job_id))
    assert not list(run_root.glob(f"{ghost}-*")), "a refused launch leaves no run directory"
    with store.session() as s:
        assert s.get(HostRow, "sub0").cooldown_until is None  # the host is fine for everyone else
    fine = submit(store, JobRequest("id -un", 1, USER_B, "vc-u"))
    jobs = rounds_until(store, submitter_host, lambda jobs: jobs[fine].state in TERMINAL)
    assert jobs[fine].state == "COMPLETED", jobs[fine].end_reason
    assert jobs[fine].end_reason == "exited with code 0"  # (no disk-full note on a roomy disk)
    assert logs(store, ssh_executor(str(submitter_host.known_hosts)), fine).text.strip() == USER_B


def test_a_wide_job_one_of_whose_hosts_refuses_its_user_fails_and_stops_the_node_that_started(
        store, submitter_host, run_root):
    """Two 2-GPU hosts of one VC, the second reached through an account without sudo rights: a 4-GPU job
    starts on the first, is refused on the second, fails once, and its first node is stopped."""
    for name, account in (("wide-a", SERVICE), ("wide-b", BARE_SERVICE)):
        add_host(store, HostSpec(name, address="127.0.0.1", port=submitter_host.port, user=account,
                                 key_path=str(submitter_host.client_key), vc="vc-wide", executor="ssh",
                                 telemetry="emulated", gpus=2, run_as="submitter", workdir=f"~/{run_root.name}/{name}"))
    job = submit(store, JobRequest("sleep 300", 4, USER_A, "vc-wide"))
    jobs = rounds_until(store, submitter_host, lambda jobs: jobs[job].state in TERMINAL)
    assert jobs[job].state == "FAILED" and f"host wide-b cannot run the job as user '{USER_A}'" in jobs[job].end_reason
    runs = {r.host: r for r in runs_of(store, job)}
    assert set(runs) == {"wide-a", "wide-b"} and runs["wide-b"].started_at is None
    assert runs["wide-a"].pid is not None, "wide-a was not launched first: this test no longer covers the stop"
    rounds_until(store, submitter_host, lambda _: all(r.state == "ended" for r in runs_of(store, job)))
    assert runs_of(store, job)[0].stop_reason == "peer_ended" or runs_of(store, job)[1].stop_reason == "peer_ended"
    deadline = time.monotonic() + 5
    while group_processes(runs["wide-a"].pid):
        assert time.monotonic() < deadline, group_processes(runs["wide-a"].pid)
        time.sleep(0.1)
    with store.session() as s:
        kinds = [e.kind for e in s.scalars(select(JobEventRow).where(JobEventRow.job_id == job))]
    assert kinds.count("failed") == 1, kinds


@pytest.mark.parametrize("user", ["a b", "$(touch /tmp/lucid-pwned)", "-u0", "root", "1000", "..", "x" * 33,
                                  "ana@example.com"])  # a tab: refused on every host (test_store_submission.py)
def test_a_user_name_that_cannot_be_an_os_user_is_refused_at_submission(store, user):
    with pytest.raises(SubmissionError) as refused:
        submit(store, JobRequest("true", 1, user, "vc-u"))
    assert set(refused.value.errors) == {"user"} and "sub0" in refused.value.errors["user"]
    assert jobs_by_id(store) == {}
    assert not Path("/tmp/lucid-pwned").exists()


@pytest.mark.parametrize("user", [None, "", "a;b", "$(id)", "-n", "root", "0"])
def test_the_executor_refuses_a_bad_user_before_any_host_shell(tmp_path, user):
    from lucid_core.runtime.hosts.executor import HostAddress, LaunchSpec, RunAsRefused
    from lucid_core.runtime.hosts.local_executor import local_executor

    host = HostAddress("sub0", executor="local", workdir=str(tmp_path / "runs"), run_as="submitter")
    with pytest.raises(RunAsRefused, match="host sub0 cannot run the job as user"):
        local_executor().launch(host, LaunchSpec("r1", f"touch {tmp_path / 'ran'}", user=user))
    assert not (tmp_path / "runs").exists() and not (tmp_path / "ran").exists()  # no script reached a shell


def test_the_cli_adds_a_submitter_host_lists_it_and_refuses_a_bad_user_on_it(tmp_path, capsys):
    import json

    from lucid_core.cli import main

    url = f"sqlite:///{tmp_path / 'lucid.db'}"
    assert main(["hosts", "add", "g0", "--store", url, "--executor", "local", "--gpus", "2", "--vc", "vc-c",
                 "--run-as", "submitter"]) == 0
    assert main(["hosts", "add", "g1", "--store", url, "--executor", "local", "--gpus", "2", "--vc", "vc-d",
                 "--workdir", str(tmp_path / "g1")]) == 0
    capsys.readouterr()
    assert main(["hosts", "list", "--store", url, "--json"]) == 0
    assert {h["name"]: h["run_as"] for h in json.loads(capsys.readouterr().out)} == {"g0": "submitter",
                                                                                      "g1": "account"}
    assert main(["submit", "--store", url, "--gpus", "1", "--vc", "vc-c", "--user", "ana smith", "--", "true"]) == 2
    assert "user: must be a POSIX user name" in capsys.readouterr().err
    # VC vc-d has no such host (and no profiling host runs as submitter): any user name is still taken
    assert main(["submit", "--store", url, "--gpus", "1", "--vc", "vc-d", "--user", "ana smith", "--", "true"]) == 0
    with pytest.raises(SystemExit):
        main(["hosts", "add", "g2", "--store", url, "--executor", "local", "--gpus", "2", "--run-as", "bob"])


def test_the_api_answers_422_naming_user_for_a_name_a_submitter_host_cannot_run(tmp_path):
    from fastapi.testclient import TestClient

    from lucid_core.runtime.surfaces.api import create_app

    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    add_host(store, HostSpec("p0", executor="local", pool="profiling", gpus=1, run_as="submitter",
                             workdir="~/.lucid-runs/p0"))
    add_host(store, HostSpec("m0", executor="local", vc="vc-a", gpus=1, workdir="~/.lucid-runs/m0"))
    client = TestClient(create_app(store.url, store=store))
    # the shared profiling host runs jobs as their user, so every VC's jobs need an OS user name
    refused = client.post("/jobs", json={"command": "true", "gpus": 1, "vc": "vc-a", "user": "ana@example.com"})
    assert refused.status_code == 422 and "p0" in refused.json()["errors"]["user"], refused.text
    assert client.post("/jobs", json={"command": "true", "gpus": 1, "vc": "vc-a", "user": "ana"}).status_code == 201
    assert len(jobs_by_id(store)) == 1
    store.dispose()


def test_the_files_of_a_run_long_over_are_removed_from_the_submitters_home_too(store, submitter_host, run_root):
    from dataclasses import replace

    job = submit(store, JobRequest("echo done > result.txt; mkdir locked; chmod 000 locked", 1, USER_A, "vc-u"))
    rounds_until(store, submitter_host, lambda jobs: jobs[job].state in TERMINAL)
    (run,) = runs_of(store, job)
    work = Path(pwd.getpwnam(USER_A).pw_dir) / ".lucid-work" / run.run_id
    assert as_user(USER_A, f"test -f {work}/result.txt").returncode == 0 and (run_root / run.run_id).is_dir()
    time.sleep(0.6)
    executor = ssh_executor(str(submitter_host.known_hosts), connect_timeout_s=2, retries=1, timeout_s=20)
    report = SchedulingRound(store, executor, CONFIG, replace(SETTINGS, keep_ended_runs_s=0.5)).run()
    assert report.pruned == [run.run_id], report.errors
    assert as_user(USER_A, f"test -e {work}").returncode != 0  # the job's room in its user's home
    assert not (run_root / run.run_id).exists()  # and the control directory
