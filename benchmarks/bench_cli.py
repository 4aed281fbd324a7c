"""How fast the everyday `lucid` commands answer: `lucid queue`, `lucid status JOB` and `lucid history` on a
10,000-job store, timed as real processes (process wall, median of 5 after one warm-up), against the 0.3 s target.

The store is built with bulk inserts (no scheduling): `--jobs` jobs of which `--active` wait or run (a tenth of
those run, on emulated runs, paired two by two) and the rest have ended. On SQLite in a temporary folder, and on
PostgreSQL (a private database created on `--pg` and dropped after) when that server answers.

Also timed: `lucid --help`, and the floors: the interpreter alone, and the interpreter importing SQLAlchemy's ORM
with the store's table mappings (`lucid_core.runtime.store.schema`), the floor of a read through the ORM, which
the three commands skip on a store at the packaged schema (`plain_read`).
With `--baseline DIR` (e.g. a `git worktree add /tmp/base HEAD`), that checkout's `lucid_core` is timed too.

    .venv/bin/python benchmarks/bench_cli.py [--jobs 10000] [--active 2000] [--repeat 5]
        [--pg postgresql://postgres@127.0.0.1:5432/test] [--no-pg] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_S = 0.3
TARGETED = ("queue", "status", "history")  # the commands the 0.3 s target is for
STATES_DONE = ("COMPLETED", "COMPLETED", "COMPLETED", "FAILED", "CANCELLED")


def build_store(url: str, jobs: int, active: int, seed: int = 0) -> str:
    """Fill the (empty) store at `url` with `jobs` jobs; returns the id of a running job that shares its GPUs."""
    import sqlalchemy as sa

    from lucid_core.runtime.store.schema import JobRow, RunRow
    from lucid_core.runtime.store.store import Store

    rng = random.Random(seed)
    store = Store(url)
    now = time.time()
    running = max(2, active // 10) // 2 * 2
    job_rows, run_rows = [], []
    for seq in range(1, jobs + 1):
        job_id = f"j{seq:06d}"
        gpus = rng.choice((1, 1, 1, 2, 4, 8))
        submit = now - rng.uniform(600, 30 * 86400)
        row = {"job_id": job_id, "seq": seq, "name": f"train-{rng.choice(('bert', 'resnet', 'gpt', 'vit'))}-{seq}",
               "user": f"user{rng.randrange(40)}", "vc": f"vc{rng.randrange(4)}", "gpus": gpus,
               "command": "python train.py --epochs 10", "env": {}, "state": "", "submit_time": submit,
               "predicted_duration": rng.uniform(30, 20 * 3600)}
        index = seq - 1
        if index < running:
            row.update(state="RUNNING", start_time=submit + 60)
            partner = f"j{(seq + 1 if index % 2 == 0 else seq - 1):06d}"
            run_rows.append({"run_id": f"{job_id}-r1", "host": f"h{index // 2:04d}", "job_id": job_id,
                             "kind": "main", "pool": "main", "gpu_indices": list(range(gpus)), "node_rank": 0,
                             "partner": partner, "state": "running", "planned_at": submit + 50,
                             "started_at": submit + 60, "observed_speed": 0.9, "observed_speed_at": now - 30,
                             "observed_speed_samples": 12, "observed_speed_emulated": True})
        elif index < active:
            row.update(state="QUEUED", queue_position=index - running + 1, share_class=rng.randrange(3),
                       pending_reason=f"no compact fit for {gpus} GPU(s): the largest free block on one main node "
                                      f"of VC {row['vc']} is 0")
        else:
            start = submit + rng.uniform(10, 3600)
            state = rng.choice(STATES_DONE)
            row.update(state=state, start_time=start, end_time=start + rng.uniform(30, 10 * 3600),
                       exit_code={"COMPLETED": 0, "FAILED": 1}.get(state),
                       end_reason={"FAILED": "exited with code 1", "CANCELLED": "cancelled by its user"}.get(state))
        job_rows.append(row)
    unset = dict.fromkeys(("start_time", "end_time", "exit_code", "end_reason", "queue_position", "share_class",
                           "pending_reason"))
    with store.engine.begin() as conn:  # one key set for every row: one executemany
        for start in range(0, len(job_rows), 2000):
            conn.execute(sa.insert(JobRow.__table__), [{**unset, **r} for r in job_rows[start:start + 2000]])
        if run_rows:
            conn.execute(sa.insert(RunRow.__table__), run_rows)
    store.dispose()
    return "j000001"


@contextmanager
def private_pg_database(admin_url: str) -> Iterator[str | None]:
    """A new database on the server of `admin_url` (None when it does not answer), dropped afterwards."""
    import sqlalchemy as sa

    from lucid_core.runtime.store.store import with_installed_driver

    name = f"lucid_bench_cli_{uuid.uuid4().hex[:8]}"
    try:
        admin = sa.create_engine(with_installed_driver(admin_url), isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:  # no server, no driver, no rights
        print(f"PostgreSQL at {admin_url} not used: {type(exc).__name__}: {str(exc).splitlines()[0]}")
        yield None
        return
    try:
        yield admin_url.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def wall_s(argv: Sequence[str], cwd: Path, repeat: int, env: dict[str, str]) -> tuple[float, int]:
    """Median process wall of `argv` over `repeat` runs after one warm-up, and its output's line count."""
    first = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    if first.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {first.returncode}: {first.stderr.strip()[-500:]}")
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
        times.append(time.perf_counter() - began)
    return statistics.median(times), first.stdout.count("\n")


def lucid(*args: str) -> list[str]:
    """`lucid ARGS` as the console script runs it; the working folder's lucid_core comes first on the path."""
    return [sys.executable, "-c", "import sys; from lucid_core.cli import main; sys.exit(main())", *args]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=10000)
    ap.add_argument("--active", type=int, default=2000, help="jobs waiting or running (the rest have ended)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--pg", default="postgresql://postgres@127.0.0.1:5432/test",
                    help="a PostgreSQL server to create a private database on")
    ap.add_argument("--no-pg", action="store_true")
    ap.add_argument("--baseline", type=Path, help="another checkout whose lucid_core is timed alongside")
    ap.add_argument("--more", action="store_true",
                    help="also time `lucid explain`, `eta` and `metrics` (ORM and live models; no target)")
    args = ap.parse_args(argv)
    checkouts = {"": REPO, **({" (baseline)": args.baseline.resolve()} if args.baseline else {})}
    env = {k: v for k, v in os.environ.items() if not k.startswith("LUCID_")}
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, load average "
          f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}; {args.jobs} jobs ({args.active} waiting or running); "
          f"process wall, median of {args.repeat} runs after one warm-up; target {TARGET_S} s\n")
    without_store = [("python -c pass (floor)", [sys.executable, "-c", "pass"], REPO),
                     ("import sqlalchemy.orm (ORM floor)", [sys.executable, "-c", "import sqlalchemy.orm"], REPO),
                     ("+ the store's tables (ORM floor)",
                      [sys.executable, "-c", "import lucid_core.runtime.store.schema"], REPO),
                     *((f"lucid --help{suffix}", lucid("--help"), checkout) for suffix, checkout in checkouts.items())]
    for label, command, cwd in without_store:
        seconds = wall_s(command, cwd, args.repeat, env)[0]
        print(f"{label:<34}{seconds:>8.3f} s")
    rows: dict[str, dict[str, float]] = {}
    lines: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp, _none() if args.no_pg else private_pg_database(args.pg) as pg:
        stores = {"sqlite": f"sqlite:///{Path(tmp) / 'lucid.db'}", **({"postgresql": pg} if pg else {})}
        for backend, url in stores.items():
            began = time.perf_counter()
            job = build_store(url, args.jobs, args.active)
            print(f"{backend}: {args.jobs} jobs written in {time.perf_counter() - began:.1f} s")
            for suffix, checkout in checkouts.items():
                commands = [("lucid queue", ["queue"]), (f"lucid status {job}", ["status", job]),
                            ("lucid history", ["history"])]
                if args.more:
                    commands += [(f"lucid explain {job}", ["explain", job]), (f"lucid eta {job}", ["eta", job]),
                                 ("lucid metrics", ["metrics"])]
                for label, cmd in commands:
                    seconds, count = wall_s(lucid(*cmd, "--store", url), checkout, args.repeat, env)
                    rows.setdefault(label + suffix, {})[backend] = seconds
                    lines[label + suffix] = count
    backends = list(dict.fromkeys(b for row in rows.values() for b in row))
    print(f"\n{'command':<34}" + "".join(f"{b:>12}" for b in backends) + f"{'target':>9}  lines printed")
    for label, row in rows.items():
        target = f"{TARGET_S:>7.1f} s" if label.split(" (")[0].split()[1] in TARGETED else " " * 9
        print(f"{label:<34}" + "".join(f"{row[b]:>10.3f} s" if b in row else " " * 12 for b in backends)
              + f"{target}  {lines[label]}")
    return 0


@contextmanager
def _none() -> Iterator[None]:
    yield None


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
