"""Embedded default: a local Airflow (SQLite, LocalExecutor) schedules a sample workload on emulated GPU hosts.

    python scripts/demo.py [--home DIR] [--jobs 18] [--port 8080] [--smtp-port 0] [--keep-running]

Sets up AIRFLOW_HOME and LUCID_HOME under --home; registers three local hosts with emulated GPU telemetry
(prof0: profiling pool, 2 GPUs; main0, main1: 1 GPU each, few enough that jobs queue and pair); seeds the
store with the sample trace as finished history (every seeded row says so); starts an SMTP sink and Airflow's
four components as `airflow standalone` would, but on 127.0.0.1 only and without log servers; trains the
models on the seeded history (`lucid_update_engine`); submits jobs from the sample trace over 45 s (run times
scaled down to seconds) that the `lucid_scheduling_round` DAG (run back to back) schedules to the end; runs
the Update Engine again, which checks the promoted models for drift on the demo's own jobs and mails the alert
to the sink; prints JCT per job, jobs ended in profiling, shared pairs, the decision log, the promoted models,
the drift check and the mail; and stops. SIGINT, SIGTERM and SIGHUP stop everything it started (TERM, a grace
period, then KILL).
"""

from __future__ import annotations

import argparse
import contextlib
import email
import json
import mailbox
import math
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Collection
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SAMPLE_TRACE = REPO / "include" / "sample" / "trace.csv"
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED"}
HOST = "127.0.0.1"  # everything the demo serves listens on loopback only
#: every process the demo starts carries MARKER_ENV=<home>#<demo pid>; the stop finds them by it
MARKER_ENV = "LUCID_DEMO_MARKER"
SEEDED_PREFIX = "sample-"
SEEDED_NOTE = "seeded sample history: include/sample/trace.csv (synthetic), not run on this machine"
ALERT_TO = "lucid-admins@localhost"
UPDATE_DAG = "lucid_update_engine"
ROUND_DAG = "lucid_scheduling_round"
WEEK_S = 7 * 86400.0
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class DemoStopped(Exception):
    """A stop signal arrived: unwinding runs the `finally` that stops everything the demo started."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def say(*parts: object) -> None:
    """Print and flush; a closed terminal (SIGHUP) must not keep the demo from stopping what it started."""
    with contextlib.suppress(OSError, ValueError):
        print(*parts, flush=True)


def parallelism() -> int:
    """Airflow's task slots, sized to this machine (Airflow's default of 32 starts 32 LocalExecutor workers)."""
    return max(2, os.cpu_count() or 2)


def demo_env(home: Path, port: int, smtp_port: int, marker: str) -> dict[str, str]:
    """The environment of Airflow and everything it runs: loopback API, sized parallelism, the SMTP sink."""
    env = dict(os.environ)
    env.update({
        MARKER_ENV: marker,
        "AIRFLOW_HOME": str(home / "airflow"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow' / 'airflow.db'}",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
        "AIRFLOW__CORE__PARALLELISM": str(parallelism()),
        "AIRFLOW__API_AUTH__JWT_SECRET": uuid.uuid4().hex,
        "AIRFLOW__API__SECRET_KEY": uuid.uuid4().hex,
        "AIRFLOW__API__HOST": HOST,
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://{HOST}:{port}/execution/",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
        "LUCID_HOME": str(home / "lucid"),
        "LUCID_ROUND_SCHEDULE": "@continuous",
        "LUCID_UPDATE_SCHEDULE": "none",  # the demo triggers the Update Engine itself, twice
        "LUCID_CONFIG": str(home / "lucid" / "lucid.toml"),
        "AIRFLOW_CONN_LUCID_DB": json.dumps({"conn_type": "sqlite", "host": str(home / "lucid" / "lucid.db")}),
        "AIRFLOW_CONN_SMTP_DEFAULT": json.dumps({
            "conn_type": "smtp", "host": HOST, "port": smtp_port,
            "extra": {"disable_tls": True, "disable_ssl": True, "from_email": "lucid-demo@localhost",
                      "timeout": 10}}),
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    })
    return env


def free_port() -> int:
    """An ephemeral TCP port of the loopback interface, free right now."""
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return int(probe.getsockname()[1])


# ---------------------------------------------------------------- seeded history


def seed_sample_history(store_url: str, now: float, trace_path: Path = SAMPLE_TRACE,
                        older_than_days: float = 7.0) -> tuple[int, float, float]:
    """Write the sample trace's jobs into the store as finished history; return (rows, first submit, last end).

    The trace (synthetic, two working days) moves by whole weeks, so weekdays and hours stay as generated,
    to end more than `older_than_days` before `now`: outside the default 7-day windows of the tuner and the
    daily fine-tune, inside the Update Engine's full window. Every row says what it is: job ids
    `sample-...`, `end_reason` and a `seeded` event with SEEDED_NOTE, profiles from the synthetic catalog
    marked emulated, start = submit (the trace has no queueing)."""
    from sqlalchemy import func, select

    from lucid_core.runtime.store.schema import JobEventRow, JobRow
    from lucid_core.runtime.store.store import Store
    from lucid_core.sim.catalog import WorkloadCatalog
    from lucid_core.sim.traces import read_trace

    trace = read_trace(trace_path, "generic")
    records = trace.records
    profiles = WorkloadCatalog.synthetic(7).assign(records, seed=7)
    epoch = trace.epoch if trace.epoch.tzinfo else trace.epoch.replace(tzinfo=UTC)
    last_end = max(r.submit_time + r.duration for r in records)
    newest_allowed = now - older_than_days * 86400.0 - 3600.0
    base = epoch.timestamp()
    base += math.floor((newest_allowed - (base + last_end)) / WEEK_S) * WEEK_S
    store = Store(store_url)
    try:
        with store.session() as session:
            seq0 = (session.scalar(select(func.max(JobRow.seq))) or 0) + 1
            for k, (record, profile) in enumerate(zip(records, profiles, strict=True)):
                submit = base + record.submit_time
                state = record.state if record.state in TERMINAL else "COMPLETED"
                session.add(JobRow(
                    job_id=SEEDED_PREFIX + record.job_id, seq=seq0 + k, name=record.name, user=record.user,
                    vc=record.vc, gpus=record.gpus, command=f"# {SEEDED_NOTE}", env={}, workload=profile.key,
                    state=state, submit_time=submit, start_time=submit, end_time=submit + record.duration,
                    exit_code=0 if state == "COMPLETED" else 1, end_reason=SEEDED_NOTE, profiled=True,
                    gpu_util=profile.gpu_util, mem_util=profile.mem_util, gpu_mem_mb=profile.gpu_mem_mb,
                    profile_emulated=True, amp=profile.amp))
            session.flush()  # the jobs before their events (job_events.job_id references jobs)
            session.add_all(JobEventRow(job_id=SEEDED_PREFIX + r.job_id, time=base + r.submit_time, kind="seeded",
                                        message=SEEDED_NOTE) for r in records)
    finally:
        store.dispose()
    return len(records), base + min(r.submit_time for r in records), base + last_end


def _sample_jobs(count: int, seed: int) -> list[tuple[float, int, str, str, str, str]]:
    """(delay s, gpus, user, vc, name, command) from the sample trace, run times scaled to seconds."""
    from lucid_core.sim.traces import read_trace

    records = read_trace(SAMPLE_TRACE, "generic").records
    rng = random.Random(seed)
    picked = sorted(rng.sample([r for r in records if r.gpus <= 2], count), key=lambda r: r.submit_time)
    jobs = []
    for k, r in enumerate(picked):
        seconds = max(2, min(60, round(r.duration / 120)))
        command = f"sleep {seconds}" + ("; exit 1" if r.state == "FAILED" else "")
        jobs.append((k * 45.0 / count, r.gpus, r.user, "default", r.name, command))
    return jobs


def update_conf(recent_share: float | None = None) -> dict[str, Any]:
    """The demo's Update Engine conf: the full window (it holds the seeded history) and the sink's recipient;
    `recent_share` holds out exactly the demo's own jobs on the second run."""
    # one check: it alerts at the first drifted one (a deployment waits for drift_checks_in_a_row, 2)
    conf: dict[str, Any] = {"mode": "full", "full_days": 90, "alert_to": ALERT_TO, "drift_checks_in_a_row": 1}
    if recent_share is not None:
        conf["recent_share"] = recent_share
    return conf


# ---------------------------------------------------------------- SMTP sink


class MailboxSink:
    """aiosmtpd handler: each message received is appended to an mbox file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.subjects: list[str] = []

    async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # aiosmtpd hook
        message = email.message_from_bytes(envelope.content)
        box = mailbox.mbox(str(self.path))
        try:
            box.lock()
            box.add(message)
            box.flush()
        finally:
            box.unlock()
            box.close()
        self.subjects.append(str(message.get("Subject", "")))
        return "250 OK"


def start_smtp_sink(path: Path, port: int = 0) -> tuple[Any, MailboxSink, int]:
    """An SMTP server on 127.0.0.1 (`port`, or an ephemeral one) writing to the mbox at `path`."""
    from aiosmtpd.controller import Controller

    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch()
    port = port or free_port()
    sink = MailboxSink(path)
    controller = Controller(sink, hostname=HOST, port=port)
    controller.start()
    return controller, sink, port


# ---------------------------------------------------------------- Airflow REST API


class AirflowApi:
    """The few calls the demo makes to Airflow's REST API (v2, JWT from /auth/token as admin)."""

    def __init__(self, base: str, password_file: Path) -> None:
        self.base = base
        self.password_file = password_file
        self.token = ""

    def _request(self, method: str, path: str, body: dict[str, Any] | None = None,
                 auth: bool = True) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        if auth:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=30) as reply:
                return reply.status, json.loads(reply.read() or b"null")
        except urllib.error.HTTPError as error:
            return error.code, None
        except (OSError, ValueError):
            return 0, None

    def login(self) -> bool:
        """True once the API answers and the generated admin password is accepted."""
        try:
            password = json.loads(self.password_file.read_text(encoding="utf-8"))["admin"]
        except (OSError, ValueError, KeyError):
            return False
        status, reply = self._request("POST", "/auth/token", {"username": "admin", "password": password},
                                      auth=False)
        if status in (200, 201) and isinstance(reply, dict):
            self.token = reply["access_token"]
            return True
        return False

    def unpause(self, dag_id: str) -> bool:
        """Unpause a DAG once the DAG processor has registered it (404 before)."""
        status, _ = self._request("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})
        return status == 200

    def trigger(self, dag_id: str, conf: dict[str, Any], when: float) -> str:
        """A run of `dag_id` whose logical date (the Update Engine's window end) is `when`."""
        logical = datetime.fromtimestamp(when, UTC).isoformat()
        status, reply = self._request("POST", f"/api/v2/dags/{dag_id}/dagRuns",
                                      {"logical_date": logical, "conf": conf})
        if status not in (200, 201) or not isinstance(reply, dict):
            raise RuntimeError(f"triggering {dag_id} failed (HTTP {status})")
        return str(reply["dag_run_id"])

    def run_state(self, dag_id: str, run_id: str) -> str:
        status, reply = self._request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{urllib.parse.quote(run_id, safe='')}")
        return str(reply.get("state", "")) if status == 200 and isinstance(reply, dict) else ""

    def wait_run(self, dag_id: str, run_id: str, timeout_s: float) -> str:
        """The run's final state ("success", "failed"), or its state when `timeout_s` ran out."""
        deadline = time.monotonic() + timeout_s
        state = ""
        while time.monotonic() < deadline:
            state = self.run_state(dag_id, run_id)
            if state in ("success", "failed"):
                break
            nap(3)
        return state


# ---------------------------------------------------------------- processes


def become_subreaper() -> bool:
    """Make this process the child subreaper of everything it starts (Linux prctl): a process whose parent
    ends (Lucid's jobs and telemetry agents once their launching shell exits, Airflow's task processes
    once their supervisor dies) is re-parented here, not to init, so the demo's process tree keeps all of
    them whatever session, group or process title (which overwrites /proc/PID/environ) they take."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def _proc_stats() -> dict[int, tuple[str, int, int, int]]:
    """pid -> (state, parent, process group, session) of every process now."""
    stats = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry.name}/stat").read_text().rsplit(")", 1)[1].split()
            stats[int(entry.name)] = (fields[0], int(fields[1]), int(fields[2]), int(fields[3]))
        except (OSError, IndexError, ValueError):
            continue
    return stats


def _carries(pid: int, entry: bytes) -> bool:
    try:
        return entry in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


def demo_processes(marker: str, pgids: Collection[int] = ()) -> list[int]:
    """Live (not zombie) processes the demo started: its descendants, the members of `pgids` and those
    carrying MARKER_ENV=`marker`; never this process."""
    me = os.getpid()
    stats = _proc_stats()
    children: dict[int, list[int]] = {}
    for pid, (_, parent, _, _) in stats.items():
        children.setdefault(parent, []).append(pid)
    found, todo = set(), list(children.get(me, []))
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += children.get(pid, [])
    entry = f"{MARKER_ENV}={marker}".encode()
    found |= {pid for pid, (_, _, group, _) in stats.items() if group in pgids or _carries(pid, entry)}
    return sorted(pid for pid in found if pid != me and pid in stats and stats[pid][0] not in ("Z", "X"))


#: the pids the demo waits for itself (subprocess.Popen); reap_orphans leaves them to their Popen
_OWNED: set[int] = set()


def reap_orphans() -> None:
    """Collect the exit status of re-parented processes that ended (this process is their subreaper)."""
    me = os.getpid()
    for pid, (state, parent, _, _) in _proc_stats().items():
        if parent == me and state == "Z" and pid not in _OWNED:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def nap(seconds: float) -> None:
    """Sleep, reaping ended orphans first."""
    reap_orphans()
    time.sleep(seconds)


def _signal_all(pids: list[int], pgids: Collection[int], signum: int) -> None:
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signum)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def stop_processes(procs: Collection[subprocess.Popen], marker: str, grace_s: float = 10.0,
                   names: dict[int, str] | None = None) -> list[int]:
    """TERM the process group of each of `procs` (each leads one) and every other process the demo started
    (`demo_processes`: Airflow's task processes and Lucid's jobs leave the groups), wait up to `grace_s`,
    then KILL what is left; return the pids that needed KILL (their titles in `names` when given)."""
    pgids = {p.pid for p in procs}

    def reap() -> None:
        for proc in procs:
            proc.poll()
        reap_orphans()

    left = demo_processes(marker, pgids)
    _signal_all(left, pgids, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while left and time.monotonic() < deadline:
        reap()
        time.sleep(0.2)
        left = demo_processes(marker, pgids)
    killed = list(left)
    if names is not None:
        for pid in killed:
            with contextlib.suppress(OSError):
                names[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode(errors="replace")
    while left and time.monotonic() < deadline + 10.0:
        _signal_all(left, pgids, signal.SIGKILL)
        reap()
        time.sleep(0.2)
        left = demo_processes(marker, pgids)
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
    return killed


#: Airflow's components as `airflow standalone` runs them, but without the log servers, which listen on
#: every interface (worker and triggerer logs are local files the API server reads)
COMPONENTS = {
    "scheduler": ["scheduler", "--skip-serve-logs"],
    "dag-processor": ["dag-processor"],
    "triggerer": ["triggerer", "--skip-serve-logs"],
    "api-server": ["api-server", "--host", HOST],
}


def start_airflow(env: dict[str, str], logs: Path) -> dict[str, subprocess.Popen]:
    """Each component in its own process group (its pid), output to logs/<name>.log."""
    airflow = str(Path(sys.executable).parent / "airflow")
    logs.mkdir(parents=True, exist_ok=True)
    procs = {}
    for name, command in COMPONENTS.items():
        with (logs / f"{name}.log").open("w") as log:
            procs[name] = subprocess.Popen([airflow, *command], env=env, stdin=subprocess.DEVNULL, stdout=log,
                                           stderr=subprocess.STDOUT, start_new_session=True)
            _OWNED.add(procs[name].pid)
    return procs


def _raise_stop(signum: int, frame: Any) -> None:
    raise DemoStopped(signum)


# ---------------------------------------------------------------- the demo


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", default=str(REPO / "out" / "demo-airflow"), help="where Airflow and Lucid keep state")
    parser.add_argument("--jobs", type=int, default=18, help="jobs submitted from the sample trace")
    parser.add_argument("--port", type=int, default=8080, help="Airflow's API and UI port on 127.0.0.1")
    parser.add_argument("--smtp-port", type=int, default=0, help="the SMTP sink's port on 127.0.0.1 (0: any free)")
    parser.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds")
    parser.add_argument("--stop-grace", type=float, default=10.0, help="seconds between TERM and KILL at the end")
    parser.add_argument("--keep-running", action="store_true", help="leave Airflow up at the end (Ctrl-C stops)")
    args = parser.parse_args(argv)
    home = Path(args.home).resolve()
    marker = f"{home}#{os.getpid()}"
    become_subreaper()
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _raise_stop)
    procs: dict[str, subprocess.Popen] = {}
    controller = None
    store = None
    code = 0
    try:
        prepared = _prepare_home(home)
        if prepared:
            return prepared
        controller, sink, smtp_port = start_smtp_sink(home / "mail" / "alerts.mbox", args.smtp_port)
        env = demo_env(home, args.port, smtp_port, marker)
        os.environ.update({k: env[k] for k in ("LUCID_HOME", "LUCID_CONFIG")})
        sys.path.insert(0, str(REPO))
        store = register_hosts(home)
        rows, first, last = seed_sample_history(f"sqlite:///{home / 'lucid' / 'lucid.db'}", time.time())
        say(f"[demo] seeded {rows} finished jobs of sample history ({SEEDED_NOTE}), submitted "
            f"{_day(first)} .. ended {_day(last)}; job ids {SEEDED_PREFIX}*")
        say(f"[demo] SMTP sink on {HOST}:{smtp_port}; alert mail goes to {sink.path}")
        say(f"[demo] state in {home}; starting Airflow on http://{HOST}:{args.port} "
            f"(parallelism {parallelism()}, logs in {home / 'logs'}) ...")
        subprocess.run([str(Path(sys.executable).parent / "airflow"), "db", "migrate"], env=env, check=True,
                       capture_output=True)
        procs = start_airflow(env, home / "logs")
        code = _run(args, home, procs, store, sink)
    except KeyboardInterrupt:
        code = 128 + signal.SIGINT
        say("\n[demo] interrupted: stopping")
    except DemoStopped as stop:
        code = 128 + stop.signum
        say(f"[demo] {stop}: stopping")
    finally:
        for signum in STOP_SIGNALS:  # the stop itself is not interrupted: it is bounded by --stop-grace
            signal.signal(signum, signal.SIG_IGN)
        names: dict[int, str] = {}
        killed = stop_processes(list(procs.values()), marker, args.stop_grace, names)
        if killed:
            say(f"[demo] {len(killed)} processes ignored TERM for {args.stop_grace:g} s, killed: "
                + ", ".join(sorted({names.get(pid, str(pid)) for pid in killed})))
        if controller is not None:
            controller.stop()
        if store is not None:
            store.dispose()
        if procs:
            say("[demo] stopped: Airflow, its workers, the jobs and the SMTP sink")
    return code


def _prepare_home(home: Path) -> int:
    """A fresh --home (a previous demo's is removed); 2 when it holds something else."""
    marker = home / ".lucid-demo-home"
    if home.exists() and any(home.iterdir()):
        if not marker.exists():
            say(f"[demo] {home} exists and was not made by this demo: choose another --home")
            return 2
        shutil.rmtree(home)  # a previous demo's state: start fresh
    (home / "lucid").mkdir(parents=True)
    marker.write_text("state of scripts/demo.py; removed by its next run\n")
    # Seconds-long jobs need a seconds-long profiling window; sharing "on" because a two-minute demo never
    # accumulates the per-slot load that makes the forecast switch sharing on by itself.
    (home / "lucid" / "lucid.toml").write_text(
        "[profiler]\ntprof_s = 6.0\nin_place = false\n[binder]\nsharing = \"on\"\n"
        "[forecast]\nmode_check_interval_s = 30.0\n")
    return 0


def register_hosts(home: Path) -> Any:
    """The demo's store (created) with its three local hosts of emulated GPUs: prof0 (profiling), main0, main1."""
    from lucid_core.runtime.hosts.inventory import HostSpec, add_host
    from lucid_core.runtime.store.store import Store

    store = Store(f"sqlite:///{home / 'lucid' / 'lucid.db'}")
    for name, pool, gpus in (("prof0", "profiling", 2), ("main0", "main", 1), ("main1", "main", 1)):
        add_host(store, HostSpec(name, pool=pool, executor="local", telemetry="emulated", gpus=gpus,
                                 workdir=str(home / "hosts" / name)))
    return store


def _run(args: argparse.Namespace, home: Path, procs: dict[str, subprocess.Popen], store: Any,
         sink: MailboxSink) -> int:
    """Airflow is starting: train on the seeded history, run the sample jobs, check drift, report."""
    from lucid_core.runtime.surfaces.submission import JobRequest, submit

    started = time.monotonic()
    api = AirflowApi(f"http://{HOST}:{args.port}", home / "airflow" / "simple_auth_manager_passwords.json.generated")
    while not (api.token or api.login()) or not (api.unpause(ROUND_DAG) and api.unpause(UPDATE_DAG)):
        dead = [name for name, proc in procs.items() if proc.poll() is not None]
        if time.monotonic() - started > 240 or dead:
            say(f"[demo] Airflow did not come up ({', '.join(dead) or 'timeout'}); see the logs in {home / 'logs'}")
            return 1
        nap(2)
    say(f"[demo] Airflow up after {time.monotonic() - started:.0f} s; {ROUND_DAG} unpaused (@continuous)")
    train_run = api.trigger(UPDATE_DAG, update_conf(), time.time())
    say(f"[demo] {UPDATE_DAG} run {train_run}: training on the seeded history (mode full)")
    plan = _sample_jobs(args.jobs, seed=7)
    t0 = time.monotonic()
    ids = []
    for delay, gpus, user, vc, name, command in plan:
        nap(max(0.0, t0 + delay - time.monotonic()))
        ids.append(submit(store, JobRequest(command, gpus=gpus, user=user, vc=vc, name=name)))
        say(f"[demo] submitted {ids[-1]} {name} ({gpus} GPU): {command}")
    while True:
        jobs = _jobs(store)
        done = sum(j["state"] in TERMINAL for j in jobs)
        if done == len(jobs):
            break
        if time.monotonic() - started > args.timeout:
            say(f"[demo] timeout: {done}/{len(jobs)} jobs ended")
            break
        nap(3)
    remaining = max(60.0, args.timeout - (time.monotonic() - started))
    say(f"[demo] {UPDATE_DAG} run {train_run}: {api.wait_run(UPDATE_DAG, train_run, remaining)}")
    finished = sum(j["state"] in TERMINAL for j in _jobs(store))
    if finished:
        history = _seeded_count(store)
        check_run = api.trigger(UPDATE_DAG, update_conf(round(finished / (history + finished), 6)), time.time())
        say(f"[demo] {UPDATE_DAG} run {check_run}: drift check of the promoted models on the demo's "
            f"{finished} jobs (held out as the recent window)")
        remaining = max(60.0, args.timeout - (time.monotonic() - started))
        say(f"[demo] {UPDATE_DAG} run {check_run}: {api.wait_run(UPDATE_DAG, check_run, remaining)}")
    _print_summary(store, args.port, home)
    _print_models_and_drift(store, home, args.port, sink)
    if args.keep_running:
        say("[demo] Airflow keeps running; Ctrl-C (or SIGTERM) stops it and everything the demo started")
        while all(proc.poll() is None for proc in procs.values()):
            nap(1)
        say("[demo] an Airflow component ended: " + ", ".join(n for n, p in procs.items() if p.poll() is not None))
    return 0


def _day(when: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(when))


def _seeded_count(store: Any) -> int:
    from lucid_core.runtime.store.schema import JobRow

    with store.session() as s:
        return s.query(JobRow).filter(JobRow.job_id.startswith(SEEDED_PREFIX)).count()


def _jobs(store: Any) -> list[dict[str, Any]]:
    """The jobs the demo submitted (not the seeded history), in submission order."""
    from lucid_core.runtime.store.schema import JobRow

    with store.session() as s:
        return [{c: getattr(j, c) for c in ("job_id", "name", "user", "gpus", "state", "submit_time", "end_time",
                                            "ended_in_profiling", "exit_code")}
                for j in s.query(JobRow).filter(~JobRow.job_id.startswith(SEEDED_PREFIX)).order_by(JobRow.seq)]


def _print_summary(store: Any, port: int, home: Path) -> None:
    from lucid_core.runtime.store.schema import DecisionRow, RunRow
    from lucid_core.runtime.surfaces.shared_time import shared_pairs

    jobs = _jobs(store)
    say("\n== JCT per job ==")
    say(f"{'job':10} {'name':34} {'GPUs':>4} {'state':10} {'JCT (s)':>8}  ended in profiling")
    for j in jobs:
        jct = j["end_time"] - j["submit_time"] if j["end_time"] else float("nan")
        say(f"{j['job_id']:10} {j['name'][:34]:34} {j['gpus']:>4} {j['state']:10} {jct:8.1f}  "
            f"{'yes' if j['ended_in_profiling'] else ''}")
    ended = [j for j in jobs if j["end_time"]]
    if ended:
        say(f"average JCT {sum(j['end_time'] - j['submit_time'] for j in ended) / len(ended):.1f} s over "
            f"{len(ended)} jobs; {sum(j['ended_in_profiling'] for j in jobs)} ended in profiling")
    with store.session() as s:
        # shared: both ran on one GPU at once, by the run records (a partner that ended in profiling did not)
        pairs = shared_pairs(s, time.time())
        placed = {tuple(sorted((r.job_id, r.partner))) for r in s.query(RunRow).filter(RunRow.partner.is_not(None))}
        decisions = s.query(DecisionRow).order_by(DecisionRow.id).all()
        say(f"\n== pairs that shared a GPU: {len(pairs)} ==")
        for (a, b), seconds in sorted(pairs.items()):
            say(f"  {a} + {b}: {seconds:.1f} s together")
        never = sorted(placed - set(pairs))
        if never:
            say(f"  placed as pairs but never ran together: {', '.join(f'{a} + {b}' for a, b in never)}")
        say(f"\n== decision log ({len(decisions)} decisions) ==")
        for d in decisions:
            say(f"  round {d.round_id:>3} {d.kind:16} {d.job_id or '':10} {d.reason}")


def _print_models_and_drift(store: Any, home: Path, port: int, sink: MailboxSink) -> None:
    from lucid_core.runtime.surfaces.queries import model_versions

    base = f"http://{HOST}:{port}"
    say("\n== models promoted by the Update Engine ==")
    versions = model_versions(store)
    for v in versions:
        say(f"  {v.kind:22} version {v.version:>3} {'active' if v.active else '':6} {v.note}")
    if not versions:
        say(f"  none: see the {UPDATE_DAG} runs at {base}/dags/{UPDATE_DAG}")
    say("\n== drift check (the promoted models on the demo's own jobs) ==")
    drift_files = sorted((home / "lucid" / "reports" / "drift").glob("*.json"))
    for path in drift_files:
        data = json.loads(path.read_text(encoding="utf-8"))
        for r in data.get("reports", []):
            shifts = ", ".join(f"{s['feature']} {s['psi']:.2f}" for s in r.get("shifts", []))
            say(f"  {r['model']:10} error ratio {r['mae_ratio']:.2f} (alert above {r['mae_ratio_threshold']:g}); "
                f"PSI {shifts}: {'DRIFT' if r['drifted'] else 'ok'}")
        if data.get("alert_sent_to"):
            say(f"  alert sent to {data['alert_sent_to']}")
    if not drift_files:
        say("  no drift check ran (it needs a promoted model and a second Update Engine run)")
    say(f"\n== mail received by the SMTP sink: {len(sink.subjects)} ==")
    for subject in sink.subjects:
        say(f"  {subject}")
    say(f"  read it: python -c \"import mailbox; [print(m) for m in mailbox.mbox('{sink.path}')]\"  "
        f"(an mbox file: mutt -f {sink.path})")
    password = home / "airflow" / "simple_auth_manager_passwords.json.generated"
    say(f"\nUI: {base}  (user admin, password in {password})")
    say(f"Lucid views: {base}/lucid/queue, /lucid/running, /lucid/jobs (history), /lucid/models (promoted models), "
        f"/lucid/drift (drift checks), /lucid/tuner; DAG runs: {base}/dags/{ROUND_DAG}, {base}/dags/{UPDATE_DAG}")
    say(f"Tune from the UI: {base}/dags/lucid_system_tuner -> Trigger -> Trigger (defaults: this store's jobs of the "
        "last 7 days, i.e. the demo's own, on these hosts)")
    bin_dir = Path(sys.executable).parent
    say(f"CLI on this demo's store:\n  export PATH=\"{bin_dir}:$PATH\" LUCID_HOME=\"{home / 'lucid'}\"\n"
        "  lucid history; lucid status JOB; lucid logs JOB --stderr; lucid explain JOB")


if __name__ == "__main__":
    raise SystemExit(main())
