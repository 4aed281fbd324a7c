"""`lucid queue`, `status` and `history` read a current store without SQLAlchemy (`plain_read`, `plain_views`):
each answer equals its ORM twin in `queries` on SQLite and PostgreSQL, over a store with every kind of row the
views treat apart (each queue, sharing pairs now and past, odd hand-edited values, every finished state); a
store that is not current, or not a store, is left to `Store`, which migrates it."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest
import sqlalchemy as sa
from alembic import command

from lucid_core.domain import JobState, RunState
from lucid_core.runtime.hosts.inventory import HostSpec, add_host
from lucid_core.runtime.store import plain_read
from lucid_core.runtime.store.plain_read import BOOLEAN_COLUMNS, JSON_COLUMNS, PlainReader, open_plain_reader
from lucid_core.runtime.store.schema import JobRow, RunRow
from lucid_core.runtime.store.schema_head import packaged_head
from lucid_core.runtime.store.store import Store, _alembic_config
from lucid_core.runtime.surfaces import plain_views, queries
from lucid_core.runtime.surfaces.job_views import HistoryQuery, UnknownJob

NOW = 1_800_000_000.0
YIELDED_FIRST = NOW - 86_000.0  # when the yielded job of `_fill` first started on the main cluster
STATES = [JobState.SUBMITTED, JobState.PROFILING, JobState.QUEUED, JobState.RUNNING, JobState.COMPLETED,
          JobState.FAILED, JobState.CANCELLED]


def _job(k: int, state: JobState, **changes) -> dict:
    """A job row: the k-th of a mixed store, `changes` made (odd values included)."""
    finished = state in (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)
    started = state in (JobState.RUNNING, JobState.PROFILING) or (finished and k % 5 != 0)
    row = {"job_id": f"j{k:03d}", "seq": k, "name": f"job {k}" if k % 4 else "", "user": ("ana", "bo", "user")[k % 3],
           "vc": ("a", "b")[k % 2], "gpus": 1 + k % 8, "command": "python train.py", "env": {"K": str(k)},
           "state": state.value, "submit_time": NOW - 90_000 + 100 * k,
           "start_time": NOW - 80_000 + 100 * k if started else None,
           "end_time": NOW - 70_000 + 50 * k if finished and started else (NOW - 75_000 if finished else None),
           "exit_code": (0, 1, None)[k % 3] if finished else None, "end_reason": "done" if finished else None,
           "ended_in_profiling": finished and k % 2 == 0, "cancel_requested": k % 7 == 0, "amp": k % 2 == 1,
           "preemptible": k % 3 == 0, "predicted_duration": None if k % 6 == 0 else 300.0 + 17 * k,
           "share_class": None if k % 5 == 0 else k % 3, "queue_position": None if finished else 1 + k % 9,
           "pending_reason": None if finished or state is JobState.RUNNING else f"waits for {1 + k % 8} GPU(s)",
           "yields": 0}
    return {**row, **changes}


def _run(job_id: str, run_id: str, state: RunState, gpus: list[int] | str, *, partner: str | None = None,
         start: float | None = None, end: float | None = None, kind: str = "main", rank: int = 0,
         speed: float | None = None, host: str = "m0", stop: str | None = None) -> dict:
    return {"run_id": run_id, "host": host, "job_id": job_id, "kind": kind, "pool": "main", "gpu_indices": gpus,
            "node_rank": rank, "partner": partner, "profile_in_place": False, "state": state.value,
            "stop_reason": stop,
            "planned_at": (start or NOW) - 5, "started_at": start, "ended_at": end, "pid": 4000 if start else None,
            "exit_code": 0 if end else None, "outcome": "exited" if end else None, "observed_speed": speed,
            "observed_speed_at": NOW - 30 if speed else None, "observed_speed_samples": 12 if speed else None,
            "observed_speed_emulated": True if speed else None}


def _fill(url: str) -> list[str]:
    """A store of 70 jobs in every state, two sharing now (one measured), a past pair, a partner that never ran
    beside its job, a wide job; returns the job ids."""
    store = Store(url)
    add_host(store, HostSpec("m0", executor="local", telemetry="emulated", gpus=8, vc="a", workdir="/tmp/m0"))
    add_host(store, HostSpec("m1", executor="local", telemetry="emulated", gpus=8, vc="b", workdir="/tmp/m1"))
    jobs = [_job(k, STATES[k % len(STATES)]) for k in range(70)]
    running = [j["job_id"] for j in jobs if j["state"] == JobState.RUNNING.value]
    finished = [j["job_id"] for j in jobs if j["state"] == JobState.COMPLETED.value]
    a, b, c, d, e, f = running[:6]
    runs = [_run(a, "r-a", RunState.RUNNING, [0, 1], partner=b, start=NOW - 600, speed=0.83),
            _run(b, "r-b", RunState.RUNNING, [0, 1], partner=a, start=NOW - 500),
            _run(c, "r-c", RunState.RUNNING, [2], partner=finished[0], start=NOW - 400),  # partner long gone
            # GPU indices as a JSON string (a hand edit): text to both paths, on PostgreSQL too (psycopg2 parses)
            _run(c, "r-c2", RunState.ENDED, "[2]", partner=finished[0], start=NOW - 9500, end=NOW - 9400),
            _run(d, "r-d0", RunState.RUNNING, [0, 1, 2, 3], start=NOW - 300, host="m1"),
            _run(d, "r-d0", RunState.RUNNING, [0, 1, 2, 3], start=NOW - 300, host="m0", rank=1),
            # a stop pending: for a launch that went out unanswered (no start time), and for a run that started
            _run(e, "r-e", RunState.RUNNING, [6], host="m1", stop="cancel"),
            _run(f, "r-f", RunState.RUNNING, [7], start=NOW - 200, host="m1", stop="preempt"),
            _run(finished[0], "r-f0", RunState.ENDED, [2], partner=finished[1], start=NOW - 9000, end=NOW - 8000),
            _run(finished[1], "r-f1", RunState.ENDED, [2], partner=finished[0], start=NOW - 8500, end=NOW - 7000),
            _run(finished[2], "r-p2", RunState.ENDED, [4], kind="profiling", start=NOW - 9900, end=NOW - 9700),
            _run(finished[2], "r-f2", RunState.ENDED, [5], partner=finished[3], start=NOW - 9600, end=NOW - 9500),
            _run(finished[3], "r-f3", RunState.ENDED, [5], partner=finished[2], start=NOW - 9400, end=NOW - 9000),
            # a job that yielded once: its stored start is its second run's (below), its first ran before
            _run(finished[4], "r-y4", RunState.ENDED, [6], start=YIELDED_FIRST, end=YIELDED_FIRST + 300),
            _run(finished[4], "r-y4b", RunState.ENDED, [6], start=_job(int(finished[4][1:]), JobState.COMPLETED)
                 ["start_time"], end=NOW - 70_000 + 50 * int(finished[4][1:]))]
    for job in jobs:
        if job["job_id"] == finished[4]:
            job["yields"] = 1
    with store.engine.begin() as conn:
        conn.execute(sa.insert(JobRow.__table__), jobs)
        conn.execute(sa.insert(RunRow.__table__), runs)
    store.dispose()
    return [j["job_id"] for j in jobs]


def _completed(ids: list[str]) -> list[str]:
    """The COMPLETED jobs of `_fill`, in order (the past pairs are the first four)."""
    return [job_id for job_id in ids if STATES[int(job_id[1:]) % len(STATES)] is JobState.COMPLETED]


@pytest.fixture
def filled(store_url, monkeypatch):
    """A filled store, both read paths' clocks held at NOW (the spans of a pair sharing now end at the read)."""
    ids = _fill(store_url)
    monkeypatch.setattr(Store, "now", lambda self: NOW)
    monkeypatch.setattr(PlainReader, "now", lambda self: NOW)
    store = Store(store_url)
    yield store_url, store, ids
    store.dispose()


def _plain(url: str) -> PlainReader:
    reader = open_plain_reader(url)
    assert reader is not None, "a store at the packaged head is read plainly"
    return reader


def test_queue_equals_the_orm_queue(filled):
    url, store, _ = filled
    for priority in (True, False):
        with _plain(url) as reader:
            plain = plain_views.queue(reader, priority_in_reason=priority)
        assert plain == queries.queue(store, priority_in_reason=priority)
        assert len(plain) == 40 and plain[0]["state"] == JobState.RUNNING.value


def test_status_of_every_job_equals_the_orm_status(filled):
    url, store, ids = filled
    seen_shared = seen_spans = 0
    with _plain(url) as reader:
        for job_id in ids:
            plain = plain_views.status(reader, job_id)
            assert plain == queries.status(store, job_id), job_id
            seen_shared += plain["shared"] is not None
            seen_spans += bool(plain["shared_spans"])
        # the pair now and the past pair that overlapped, each seen from both sides; the other past pair never ran
        # at one time, so it has words but no span
        assert seen_shared == 2 and seen_spans == 4
        yielded_job = plain_views.status(reader, _completed(ids)[4])  # started first before its latest run
        assert yielded_job["first_start_time"] == YIELDED_FIRST < yielded_job["start_time"]
        stopping = {r["run_id"]: r["stopping"] for job_id in ids for r in plain_views.status(reader, job_id)["runs"]}
        assert stopping["r-e"] == ("stopping: its job was cancelled; its launch went unanswered, so it may not "
                                   "have started")
        assert stopping["r-f"] == "stopping: it yields its GPUs to other work"
        assert stopping["r-a"] is None and stopping["r-f0"] is None
        assert "never ran on one GPU at the same time" in plain_views.status(reader, _completed(ids)[2])["sharing"]
        for missing in ("j999", "", "a\x00b"):
            with pytest.raises(UnknownJob):
                plain_views.status(reader, missing)
            with pytest.raises(UnknownJob):
                queries.status(store, missing)


@pytest.mark.parametrize("query", [
    HistoryQuery(), HistoryQuery(limit=7, offset=3), HistoryQuery(user="user"), HistoryQuery(vc="b", limit=100),
    HistoryQuery(states=("FAILED", "CANCELLED")), HistoryQuery(since=NOW - 69_000, until=NOW - 68_500),
    HistoryQuery(user="ana", vc="a", states=("COMPLETED",), offset=1), HistoryQuery(offset=1000),
], ids=lambda q: repr(q)[13:60])
def test_history_equals_the_orm_history(filled, query):
    url, store, _ = filled
    with _plain(url) as reader:
        plain = plain_views.history(reader, query)
    with store.session() as session:
        full = queries.history(session, query)
    for a, b in zip(plain.rows, full.rows, strict=False):
        assert a == b, {k: (a[k], b.get(k)) for k in a if a[k] != b.get(k)}
    assert plain == full
    assert query.offset >= full.total or plain.rows
    for row in plain.rows:  # the job that yielded counts from its first start on the main cluster
        if row["job_id"] == _completed(filled[2])[4]:
            assert row["start_time"] == YIELDED_FIRST and row["queued_s"] == YIELDED_FIRST - row["submit_time"]
            assert row["elapsed_s"] == row["end_time"] - YIELDED_FIRST
            second = _job(int(row["job_id"][1:]), JobState.COMPLETED)["start_time"]
            assert row["ran_s"] == 300 + (row["end_time"] - second) and row["hosts"] == "m0"


def test_odd_stored_values_read_the_same_both_ways(tmp_path, monkeypatch):
    """What a hand edit leaves in a SQLite store (text in number columns, 2 in a flag) reads alike."""
    url = f"sqlite:///{tmp_path / 'odd.db'}"
    _fill(url)
    with sqlite3.connect(tmp_path / "odd.db") as conn:
        conn.execute("UPDATE jobs SET queue_position = 'soon', predicted_duration = 'long' WHERE seq = 2")
        conn.execute("UPDATE jobs SET gpus = 2.5, cancel_requested = 2, end_time = 'x' WHERE seq = 4")
        conn.execute("UPDATE jobs SET start_time = 'soon', end_time = 'later' WHERE seq = 11")  # a finished job
    monkeypatch.setattr(Store, "now", lambda self: NOW)
    monkeypatch.setattr(PlainReader, "now", lambda self: NOW)
    store = Store(url)
    with _plain(url) as reader:
        assert plain_views.queue(reader) == queries.queue(store)
        assert plain_views.status(reader, "j004") == queries.status(store, "j004")
        assert plain_views.status(reader, "j004")["cancel_requested"] is True
        with store.session() as session:
            assert plain_views.history(reader, HistoryQuery(limit=100)) == queries.history(session,
                                                                                           HistoryQuery(limit=100))
        odd = next(r for r in plain_views.history(reader, HistoryQuery(limit=100)).rows if r["job_id"] == "j011")
        assert odd["queued_s"] is None and odd["elapsed_s"] is None
    store.dispose()


def test_unparseable_json_reads_as_none_both_ways(tmp_path):
    """GPU indices a hand edit left as text that is not JSON (SQLite keeps it) read as None on both paths: the
    ORM's loads failed the whole status (and every round, page and API answer reading the row)."""
    url = f"sqlite:///{tmp_path / 'odd.db'}"
    _fill(url)
    with sqlite3.connect(tmp_path / "odd.db") as conn:
        conn.execute("UPDATE runs SET gpu_indices = '[0, 1' WHERE run_id = 'r-a'")
        job = conn.execute("SELECT job_id FROM runs WHERE run_id = 'r-a'").fetchone()[0]
    store = Store(url)
    with _plain(url) as reader:
        answer = plain_views.status(reader, job)
    assert answer == queries.status(store, job) and answer["runs"][0]["gpus"] is None
    store.dispose()


URLS = ["sqlite:////tmp/x.db", "sqlite:///rel/x.db", "sqlite:///~/x.db", "sqlite:////tmp/x%20y.db",
        "sqlite:///:memory:", "sqlite://", "postgresql://postgres@127.0.0.1:5432/test",
        "postgresql+psycopg2://u:pa%25ss@db.example:6543/my%2Fdb", "postgresql://u:pa/ss@h/db",
        "postgresql://u:p@ss@h/db", "postgres://u@[::1]:5432/db", "postgresql:///db", "postgresql://h",
        "postgresql://u@%2Fvar%2Frun%2Fpostgresql/db", "postgresql://h/db?sslmode=require", "postgresql://h:x/db"]


@pytest.mark.parametrize("url", URLS)
def test_a_url_is_split_as_sqlalchemy_splits_it(url):
    """The plain read connects to the database `Store` would: the same parts, decoded the same way (a password
    with '%25' or '/', a socket path, an IPv6 host); a URL SQLAlchemy cannot split is left to `Store`."""
    try:
        expected = sa.engine.make_url(url)
    except (sa.exc.ArgumentError, ValueError):
        assert plain_read.url_parts(url) is None
        return
    parts = plain_read.url_parts(url)
    assert parts is not None
    assert (parts.user, parts.password, parts.host, parts.port, parts.database) == (
        expected.username, expected.password, expected.host, expected.port, expected.database)


def test_a_sqlite_path_is_opened_as_sqlalchemy_opens_it(tmp_path, monkeypatch):
    """Percent-decoded ('x%20y' is the file 'x y'), and '~' not expanded (SQLAlchemy opens a folder named '~'):
    the plain read never answers from a file `Store` would not open."""
    Store(f"sqlite:///{tmp_path / 'x y.db'}").dispose()
    assert open_plain_reader(f"sqlite:///{tmp_path / 'x%20y.db'}") is not None
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert open_plain_reader("sqlite:///~/x y.db") is None  # $HOME/x y.db exists; ./~/x y.db does not


def test_the_converted_columns_are_the_mappings_bool_and_json_columns():
    for table, mapped in (("jobs", JobRow), ("runs", RunRow)):
        columns = mapped.__table__.columns
        assert BOOLEAN_COLUMNS[table] == {c.name for c in columns if isinstance(c.type, sa.Boolean)}
        assert JSON_COLUMNS[table] == {c.name for c in columns if isinstance(c.type, sa.JSON)}


def test_the_database_clock_reads_alike(store_url):
    store = Store(store_url)
    with _plain(store_url) as reader:
        assert abs(reader.now() - store.now()) < 2.0
    store.dispose()


def test_a_store_not_at_the_head_or_not_a_store_is_left_to_store(tmp_path, monkeypatch):
    """None (so `Store` opens, migrates or refuses it): no file, an empty file, not a database, a store stamped
    at an older revision, in memory, another dialect."""
    assert open_plain_reader(f"sqlite:///{tmp_path / 'none.db'}") is None
    assert not (tmp_path / "none.db").exists()  # looking did not create it
    (tmp_path / "empty.db").write_bytes(b"")
    (tmp_path / "junk.db").write_bytes(b"not a database" * 100)
    for name in ("empty.db", "junk.db"):
        assert open_plain_reader(f"sqlite:///{tmp_path / name}") is None
    url = f"sqlite:///{tmp_path / 'old.db'}"
    Store(url).dispose()
    assert open_plain_reader(url) is not None
    with sqlite3.connect(tmp_path / "old.db") as conn:
        conn.execute("UPDATE alembic_version SET version_num = '0013'")
    assert open_plain_reader(url) is None
    for other in ("sqlite:///:memory:", f"sqlite:///{tmp_path / 'old.db'}?mode=ro", "mysql://x@localhost/db",
                  "postgresql://nobody@127.0.0.1:1/none?executemany_mode=values_only"):
        assert open_plain_reader(other) is None
    monkeypatch.setattr(plain_read, "packaged_head", lambda: None)
    assert open_plain_reader(f"sqlite:///{tmp_path / 'old.db'}") is None


def test_an_older_store_is_migrated_by_the_cli_and_then_read_plainly(tmp_path):
    """`lucid queue` on a store stamped older goes through `Store` (which upgrades it); the next call reads
    it plainly. Real processes, so what each imported is what it ran."""
    url = f"sqlite:///{tmp_path / 'old.db'}"
    _fill(url)
    engine = sa.create_engine(url)
    with engine.begin() as conn:  # undo the newest migration (its own downgrade): the store is one revision old
        command.downgrade(_alembic_config(conn), "-1")
        assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar() != packaged_head()
    engine.dispose()
    code = ("import sys\nfrom lucid_core.cli import main\ncode = main(sys.argv[1:])\n"
            "print('ORM' if 'sqlalchemy' in sys.modules else 'PLAIN', file=sys.stderr)\nsys.exit(code)")
    answers = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", code, "queue", "--store", url], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        answers.append((done.stderr.strip().splitlines()[-1], done.stdout))
    assert [a[0] for a in answers] == ["ORM", "PLAIN"]
    assert answers[0][1] == answers[1][1] and answers[0][1].count("\n") == 41


def test_a_store_locked_past_the_busy_timeout_is_an_error_not_a_second_wait(tmp_path, monkeypatch):
    """A writer holding the file (a store not in WAL mode) past the busy timeout: the plain read says so at once
    rather than handing the store to `Store`, which would wait as long again."""
    url = f"sqlite:///{tmp_path / 'locked.db'}"
    Store(url).dispose()
    monkeypatch.setattr(plain_read, "_BUSY_TIMEOUT_S", 0.2)
    holder = sqlite3.connect(tmp_path / "locked.db", isolation_level=None)
    holder.execute("PRAGMA journal_mode=DELETE")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(sqlite3.OperationalError, match="locked"):
            open_plain_reader(url)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    reader = open_plain_reader(url)
    assert reader is not None
    reader.close()
