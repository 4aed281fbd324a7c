"""Embedded default: a local Airflow (standalone, SQLite) schedules a sample workload on emulated GPU hosts.

    python scripts/demo.py [--home DIR] [--jobs 14] [--keep-running]

Sets up AIRFLOW_HOME and LUCID_HOME under --home, registers three local hosts with emulated GPU
telemetry (prof0: profiling pool, 2 GPUs; main0, main1: 2 GPUs each), starts `airflow standalone`
with the Lucid DAGs and plugin, submits jobs from the sample trace over 45 s (run times
scaled down to seconds), lets the `lucid_scheduling_round` DAG (run back to back) schedule them to
the end, prints JCT per job, jobs ended in profiling, shared pairs and the decision log, and stops.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED"}


def _env(home: Path, port: int) -> dict[str, str]:
    env = dict(os.environ)
    env.update({
        "AIRFLOW_HOME": str(home / "airflow"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://localhost:{port}/execution/",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
        "LUCID_HOME": str(home / "lucid"),
        "LUCID_ROUND_SCHEDULE": "@continuous",
        "LUCID_CONFIG": str(home / "lucid" / "lucid.toml"),
        "AIRFLOW_CONN_LUCID_DB": json.dumps({"conn_type": "sqlite", "host": str(home / "lucid" / "lucid.db")}),
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
    })
    return env


def _sample_jobs(count: int, seed: int):
    """(delay s, gpus, user, vc, name, command) from the sample trace, run times scaled to seconds."""
    from lucid_core.sim.traces import read_trace

    records = read_trace(REPO / "include" / "sample" / "trace.csv", "generic").records
    rng = random.Random(seed)
    picked = sorted(rng.sample([r for r in records if r.gpus <= 2], count), key=lambda r: r.submit_time)
    jobs = []
    for k, r in enumerate(picked):
        seconds = max(2, min(60, round(r.duration / 120)))
        command = f"sleep {seconds}" + ("; exit 1" if r.state == "FAILED" else "")
        jobs.append((k * 45.0 / count, r.gpus, r.user, "default", r.name, command))
    return jobs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", default=str(REPO / "out" / "demo-airflow"), help="where Airflow and Lucid keep state")
    parser.add_argument("--jobs", type=int, default=18)
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds")
    parser.add_argument("--keep-running", action="store_true", help="leave Airflow up at the end (Ctrl-C stops)")
    args = parser.parse_args(argv)
    home = Path(args.home).resolve()
    marker = home / ".lucid-demo-home"
    if home.exists() and any(home.iterdir()):
        if not marker.exists():
            print(f"[demo] {home} exists and was not made by this demo: choose another --home")
            return 2
        shutil.rmtree(home)  # a previous demo's state: start fresh
    (home / "lucid").mkdir(parents=True)
    marker.write_text("state of scripts/demo.py; removed by its next run\n")
    env = _env(home, args.port)
    os.environ.update({k: env[k] for k in ("LUCID_HOME", "LUCID_CONFIG")})
    # Seconds-long jobs need a seconds-long profiling window; sharing "on" because a two-minute demo never
    # accumulates the per-slot load that makes the forecast switch sharing on by itself.
    (home / "lucid" / "lucid.toml").write_text(
        "[profiler]\ntprof_s = 6.0\nin_place = false\n[binder]\nsharing = \"on\"\n"
        "[forecast]\nmode_check_interval_s = 30.0\n")
    sys.path.insert(0, str(REPO))
    from lucid_core.runtime.hosts.inventory import HostSpec, add_host
    from lucid_core.runtime.store.store import Store
    from lucid_core.runtime.surfaces.submission import JobRequest, submit

    store = Store(f"sqlite:///{home / 'lucid' / 'lucid.db'}")
    for name, pool, gpus in (("prof0", "profiling", 2), ("main0", "main", 2), ("main1", "main", 2)):
        add_host(store, HostSpec(name, pool=pool, executor="local", telemetry="emulated", gpus=gpus,
                                 workdir=str(home / "hosts" / name)))
    print(f"[demo] state in {home}; starting Airflow standalone on http://localhost:{args.port} ...", flush=True)
    airflow = str(Path(sys.executable).parent / "airflow")
    subprocess.run([airflow, "db", "migrate"], env=env, check=True, capture_output=True)
    log = (home / "airflow-standalone.log").open("w")
    proc = subprocess.Popen([airflow, "standalone"], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    started = time.monotonic()
    try:
        while not _unpause(airflow, env, "lucid_scheduling_round"):
            if time.monotonic() - started > 240 or proc.poll() is not None:
                print("[demo] Airflow did not come up; see", home / "airflow-standalone.log")
                return 1
            time.sleep(3)
        print(f"[demo] Airflow up after {time.monotonic() - started:.0f} s; round DAG unpaused (@continuous)")
        plan = _sample_jobs(args.jobs, seed=7)
        t0 = time.monotonic()
        ids = []
        for delay, gpus, user, vc, name, command in plan:
            time.sleep(max(0.0, t0 + delay - time.monotonic()))
            ids.append(submit(store, JobRequest(command, gpus=gpus, user=user, vc=vc, name=name)))
            print(f"[demo] submitted {ids[-1]} {name} ({gpus} GPU): {command}", flush=True)
        while True:
            jobs = _jobs(store)
            done = sum(j["state"] in TERMINAL for j in jobs)
            if done == len(jobs):
                break
            if time.monotonic() - started > args.timeout:
                print(f"[demo] timeout: {done}/{len(jobs)} jobs ended")
                break
            time.sleep(3)
        _print_summary(store, args.port, home)
        if args.keep_running:
            print("[demo] Airflow keeps running; Ctrl-C to stop")
            proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        store.dispose()
    return 0


def _unpause(airflow: str, env: dict[str, str], dag_id: str) -> bool:
    """Unpause once the DAG processor has registered the DAG (unpausing an unknown DAG is a silent no-op)."""
    listed = subprocess.run([airflow, "dags", "list", "-o", "plain"], env=env, capture_output=True, text=True)
    if dag_id not in listed.stdout:
        return False
    done = subprocess.run([airflow, "dags", "unpause", dag_id], env=env, capture_output=True, text=True)
    return done.returncode == 0 and "No paused DAGs" not in done.stdout + done.stderr


def _jobs(store) -> list[dict]:
    from lucid_core.runtime.store.schema import JobRow

    with store.session() as s:
        return [{c: getattr(j, c) for c in ("job_id", "name", "user", "gpus", "state", "submit_time", "end_time",
                                            "ended_in_profiling", "exit_code")}
                for j in s.query(JobRow).order_by(JobRow.seq)]


def _print_summary(store, port: int, home: Path) -> None:
    from lucid_core.runtime.store.schema import DecisionRow, RunRow

    jobs = _jobs(store)
    print("\n== JCT per job ==")
    print(f"{'job':10} {'name':34} {'GPUs':>4} {'state':10} {'JCT (s)':>8}  ended in profiling")
    for j in jobs:
        jct = j["end_time"] - j["submit_time"] if j["end_time"] else float("nan")
        print(f"{j['job_id']:10} {j['name'][:34]:34} {j['gpus']:>4} {j['state']:10} {jct:8.1f}  "
              f"{'yes' if j['ended_in_profiling'] else ''}")
    ended = [j for j in jobs if j["end_time"]]
    if ended:
        print(f"average JCT {sum(j['end_time'] - j['submit_time'] for j in ended) / len(ended):.1f} s over "
              f"{len(ended)} jobs; {sum(j['ended_in_profiling'] for j in jobs)} ended in profiling")
    with store.session() as s:
        pairs = {tuple(sorted((r.job_id, r.partner))) for r in s.query(RunRow).filter(RunRow.partner.is_not(None))}
        decisions = s.query(DecisionRow).order_by(DecisionRow.id).all()
        print(f"\n== pairs shared on a GPU: {len(pairs)} ==")
        for a, b in sorted(pairs):
            print(f"  {a} + {b}")
        print(f"\n== decision log ({len(decisions)} decisions) ==")
        for d in decisions:
            print(f"  round {d.round_id:>3} {d.kind:16} {d.job_id or '':10} {d.reason}")
    password = home / "airflow" / "simple_auth_manager_passwords.json.generated"
    print(f"\nUI: http://localhost:{port}  (user admin, password in {password})")
    print(f"Lucid views: http://localhost:{port}/lucid/queue, /lucid/running, /lucid/jobs (history), "
          f"/lucid/tuner, /lucid/drift; DAG runs: http://localhost:{port}/dags/lucid_scheduling_round")
    print(f"Tune from the UI: http://localhost:{port}/dags/lucid_system_tuner -> Trigger -> Trigger (defaults: "
          "this store's jobs on these hosts)")
    bin_dir = Path(sys.executable).parent
    print(f"CLI on this demo's store:\n  export PATH=\"{bin_dir}:$PATH\" LUCID_HOME=\"{home / 'lucid'}\"\n"
          "  lucid history; lucid status JOB; lucid logs JOB --stderr; lucid explain JOB")


if __name__ == "__main__":
    raise SystemExit(main())
