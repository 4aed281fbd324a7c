"""The System Tuner sweep on a CeleryExecutor with two workers: do the mapped tasks spread over both?

    python benchmarks/bench_celery_tuner.py [--trace FILE --format philly --start 2017-10-01 --end 2017-10-08
                                             --nodes 72] [--out benchmarks/results/airflow-celery.md]

Starts a throwaway PostgreSQL metadata DB (127.0.0.1:5432, user postgres), Redis as the broker
(127.0.0.1:6379, a dedicated DB index), the API server, scheduler, DAG processor and two Celery
workers (`w1`, `w2`, concurrency 2 each, LUCID_WORKER_NAME set per worker), triggers
`lucid_system_tuner` through the REST API with a grid, waits, and prints which worker ran each
mapped configuration (from the report and from Airflow's task instances), with wall times.
Default trace: the embedded sample (2 days, 400 jobs) on 2 nodes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def main(argv: list[str] | None = None) -> int:
    import httpx
    import psycopg2

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", default=str(REPO / "include" / "sample" / "trace.csv"))
    parser.add_argument("--format", default="generic")
    parser.add_argument("--start", default="")
    parser.add_argument("--end", default="")
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--redis-db", type=int, default=11)
    parser.add_argument("--out", default="", help="also write the markdown result here")
    parser.add_argument("--workdir", default="/tmp/lucid-celery-bench")
    args = parser.parse_args(argv)

    root = Path(args.workdir) / uuid.uuid4().hex[:8]
    root.mkdir(parents=True)
    database = f"lucid_celery_{uuid.uuid4().hex[:8]}"
    admin = psycopg2.connect("host=127.0.0.1 port=5432 user=postgres dbname=postgres")
    admin.autocommit = True
    with admin.cursor() as cursor:
        cursor.execute(f'CREATE DATABASE "{database}"')
    subprocess.run(["redis-cli", "-h", "127.0.0.1", "-n", str(args.redis_db), "FLUSHDB"], check=True,
                   capture_output=True)
    port = _free_port()
    (root / "passwords.json").write_text(json.dumps({"admin": "bench"}))
    env = dict(os.environ)
    env.update({
        "AIRFLOW_HOME": str(root / "airflow"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"postgresql+psycopg2://postgres@127.0.0.1:5432/{database}",
        "AIRFLOW__CELERY__BROKER_URL": f"redis://127.0.0.1:6379/{args.redis_db}",
        "AIRFLOW__CELERY__RESULT_BACKEND": f"db+postgresql+psycopg2://postgres@127.0.0.1:5432/{database}",
        "AIRFLOW__CELERY__WORKER_CONCURRENCY": "2",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(root / "passwords.json"),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{port}/execution/",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API_AUTH__JWT_SECRET": uuid.uuid4().hex,
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "LUCID_HOME": str(root / "lucid"),
        "LUCID_TRACES_DIR": str(Path(args.trace).resolve().parent),  # the folder tuner runs may read traces from
        "AIRFLOW_CONN_LUCID_DB": json.dumps({"conn_type": "sqlite", "host": str(root / "lucid" / "lucid.db")}),
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p),
        "PATH": os.pathsep.join([str(BIN), os.environ.get("PATH", "")]),
    })
    subprocess.run([str(BIN / "airflow"), "db", "migrate"], env=env, check=True, capture_output=True)
    logs = root / "logs"
    logs.mkdir()
    commands = {"api-server": ["api-server", "--port", str(port)], "scheduler": ["scheduler"],
                "dag-processor": ["dag-processor"],
                "w1": ["celery", "worker", "--celery-hostname", "w1@%h", "--concurrency", "2", "--skip-serve-logs"],
                "w2": ["celery", "worker", "--celery-hostname", "w2@%h", "--concurrency", "2", "--skip-serve-logs"]}
    procs = []
    try:
        for name, command in commands.items():
            proc_env = dict(env, LUCID_WORKER_NAME=name) if name.startswith("w") else env
            handle = (logs / f"{name}.log").open("w")
            procs.append(subprocess.Popen([str(BIN / "airflow"), *command], env=proc_env, stdout=handle,
                                          stderr=subprocess.STDOUT, start_new_session=True))
        base = f"http://127.0.0.1:{port}"
        token = _login(base)
        headers = {"Authorization": f"Bearer {token}"}
        deadline = time.monotonic() + 240
        while httpx.get(f"{base}/api/v2/dags/lucid_system_tuner", headers=headers, timeout=10).status_code != 200:
            if time.monotonic() > deadline:
                raise SystemExit("the tuner DAG never appeared")
            time.sleep(2)
        httpx.patch(f"{base}/api/v2/dags/lucid_system_tuner", headers=headers, json={"is_paused": False},
                    timeout=10).raise_for_status()
        conf = {"trace_path": args.trace, "trace_format": args.format, "window_start": args.start,
                "window_end": args.end, "main_nodes": args.nodes, "tprof_s": [60, 100, 200, 300],
                "sharing": ["auto", "off"], "cprof_nodes": [1, 2], "objective": "avg_jct"}
        triggered = time.monotonic()
        reply = httpx.post(f"{base}/api/v2/dags/lucid_system_tuner/dagRuns", headers=headers, timeout=30,
                           json={"logical_date": None, "conf": conf})
        reply.raise_for_status()
        run_id = reply.json()["dag_run_id"]
        state = ""
        while state not in ("success", "failed"):
            time.sleep(2)
            state = httpx.get(f"{base}/api/v2/dags/lucid_system_tuner/dagRuns/{run_id}", headers=headers,
                              timeout=10).json()["state"]
        wall = time.monotonic() - triggered
        instances = httpx.get(f"{base}/api/v2/dags/lucid_system_tuner/dagRuns/{run_id}/taskInstances",
                              headers=headers, params={"limit": 100}, timeout=10).json()["task_instances"]
        mapped = sorted((ti for ti in instances if ti["task_id"] == "simulate_configuration"),
                        key=lambda ti: ti["map_index"])
        summary = json.loads(next((root / "lucid" / "reports" / "tuner").glob("*/report.json")).read_text())
        text = _markdown(args, state, wall, mapped, summary)
        print(text)
        if args.out:
            Path(args.out).write_text(text, encoding="utf-8")
        return 0 if state == "success" else 1
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        with admin.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        admin.close()


def _login(base: str) -> str:
    import httpx

    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            reply = httpx.post(f"{base}/auth/token", json={"username": "admin", "password": "bench"}, timeout=5)
            if reply.status_code in (200, 201):
                return reply.json()["access_token"]
        time.sleep(1)
    raise SystemExit("API server did not come up")


def _markdown(args, state: str, wall: float, mapped: list[dict], summary: dict) -> str:
    by_index = {r["index"]: r for r in summary["ranked"]}
    lines = [f"Trace `{Path(args.trace).name}` {args.start or ''}..{args.end or ''} on {args.nodes} nodes; "
             f"run state **{state}**, trigger to end {wall:.1f} s; {len(mapped)} mapped configurations.", "",
             "| map index | configuration | worker (LUCID_WORKER_NAME) | Airflow hostname | task s | sim s | "
             "avg JCT (h) |", "|---|---|---|---|---|---|---|"]
    for ti in mapped:
        result = by_index.get(ti["map_index"], {})
        overrides = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in result.get("overrides", {}).items())
        jct = result.get("metrics", {}).get("avg_jct_s")
        lines.append(f"| {ti['map_index']} | {overrides} | {result.get('worker', '')} | {ti.get('hostname', '')} | "
                     f"{ti.get('duration') or 0:.1f} | {result.get('wall_seconds', 0):.2f} | "
                     f"{jct / 3600 if jct else float('nan'):.3f} |")
    counts = Counter(r.get("worker", "") for r in summary["ranked"])
    lines += ["", "Configurations per worker: " + ", ".join(f"{w}: {n}" for w, n in sorted(counts.items())),
              f"Best ({summary['objective']}): #{summary['best']['index']} {json.dumps(summary['best']['overrides'])}"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
