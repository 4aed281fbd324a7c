"""Store, migrations, validation, lease and inventory on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
import sqlalchemy as sa
from alembic.script import ScriptDirectory

from lucid_core.runtime.hosts.inventory import HostSpec, InventoryError, add_host, drain_host, list_hosts, remove_host
from lucid_core.runtime.store import lease
from lucid_core.runtime.store.store import MIGRATIONS_DIR, Store
from lucid_core.runtime.surfaces.submission import JobRequest, SubmissionError, UnknownJob, cancel, submit

HEAD = ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()  # the newest packaged migration


def _hosts(store):
    add_host(store, HostSpec("m0", executor="local", vc="vc-a", gpus=4, workdir="~/.lucid-runs/m0"))
    add_host(store, HostSpec("m1", executor="local", vc="vc-b", gpus=8, workdir="~/.lucid-runs/m1"))
    add_host(store, HostSpec("p0", executor="local", vc="vc-a", pool="profiling", gpus=2, workdir="~/.lucid-runs/p0"))


def test_open_migrates_to_head_and_reopening_is_a_no_op(store_url):
    first = Store(store_url)
    assert first.revision() == HEAD
    tables = set(sa.inspect(first.engine).get_table_names())
    assert {"jobs", "job_events", "hosts", "gpus", "runs", "profiles", "profile_samples", "decisions",
            "leases", "model_versions", "scheduler_state", "rounds"} <= tables
    second = Store(store_url)
    assert second.revision() == HEAD
    first.dispose()
    second.dispose()


def test_submission_validation_names_each_field(store):
    _hosts(store)
    cases = [
        (JobRequest("train", 9, "u", "vc-a"), "gpus", "more than any VC has"),
        (JobRequest("train", 5, "u", "vc-a"), "gpus", "more than VC vc-a has"),
        (JobRequest("train", 0, "u", "vc-a"), "gpus", "positive"),
        (JobRequest("train", 1, "u", "nope"), "vc", "unknown VC"),
        (JobRequest("   ", 1, "u", "vc-a"), "command", "empty"),
        (JobRequest([], 1, "u", "vc-a"), "command", "empty"),
        (JobRequest("x" * 70000, 1, "u", "vc-a"), "command", "at most"),
        (JobRequest("train", 1, "u" * 200, "vc-a"), "user", "at most"),
        (JobRequest("train", 1, "u", "vc-a", env={"CUDA_VISIBLE_DEVICES": "0"}), "env.CUDA_VISIBLE_DEVICES",
         "set by the scheduler"),
        (JobRequest("train", 1, "u", "vc-a", env={"1BAD": "x"}), "env.1BAD", "not a valid"),
    ]
    for request, field, words in cases:
        with pytest.raises(SubmissionError) as info:
            submit(store, request)
        assert field in info.value.errors, (field, info.value.errors)
        assert words in info.value.errors[field]
    job = submit(store, JobRequest(["python", "-c", "print('a b')"], 8, "u", "vc-b"))
    assert job == "j000001"
    assert submit(store, JobRequest("x", 1, "u", "vc-a")) == "j000002"
    from lucid_core.runtime.surfaces.queries import status

    assert status(store, job)["command"] == "python -c 'print('\"'\"'a b'\"'\"')'"


def test_the_last_job_under_a_key_prefix_is_found_per_user_and_wildcards_match_only_themselves(store):
    from lucid_core.runtime.surfaces.submission import latest_job_with_key_prefix

    add_host(store, HostSpec("m0", executor="local", gpus=1))
    first = submit(store, JobRequest(command="true", gpus=1, user="ann", vc="default", idempotency_key="run%1:try-a"))
    second = submit(store, JobRequest(command="true", gpus=1, user="ann", vc="default", idempotency_key="run%1:try-b"))
    submit(store, JobRequest(command="true", gpus=1, user="bob", vc="default", idempotency_key="run%1:try-c"))
    submit(store, JobRequest(command="true", gpus=1, user="ann", vc="default", idempotency_key="runX1:try-d"))
    found = latest_job_with_key_prefix(store, "ann", "run%1:")
    assert (found.job_id, found.state, found.idempotency_key) == (second, "SUBMITTED", "run%1:try-b")
    assert first != second and latest_job_with_key_prefix(store, "ann", "run_1:") is None
    assert latest_job_with_key_prefix(store, "carl", "run%1:") is None
    with pytest.raises(ValueError, match="key prefix"):
        latest_job_with_key_prefix(store, "ann", "")


def test_cancel_of_unknown_and_of_waiting_jobs(store):
    _hosts(store)
    with pytest.raises(UnknownJob):
        cancel(store, "j999999")
    job = submit(store, JobRequest("sleep 1", 1, "u", "vc-a"))
    assert cancel(store, job) == "SUBMITTED"


def test_lease_admits_one_holder_until_it_expires_or_is_released(store):
    assert lease.acquire(store, "a", ttl_s=10, now=100.0)
    assert not lease.acquire(store, "b", ttl_s=10, now=105.0)
    assert lease.acquire(store, "a", ttl_s=10, now=105.0)  # renewal
    assert lease.holder_of(store, 106.0) == "a"
    assert lease.acquire(store, "b", ttl_s=10, now=116.0)  # a's lease lapsed
    lease.release(store, "b")
    assert lease.holder_of(store, 116.5) is None
    assert lease.acquire(store, "c", ttl_s=10, now=117.0)


def test_every_take_of_the_lease_gets_a_higher_generation(store):
    first = lease.acquire(store, "a", ttl_s=10, now=100.0)
    again = lease.acquire(store, "a", ttl_s=10, now=101.0)  # the same holder again (a retried task)
    other = lease.acquire(store, "b", ttl_s=10, now=120.0)  # a take-over after it lapsed
    assert first.generation < again.generation < other.generation
    assert lease.current(store) == ("b", other.generation)


def test_a_fenced_holder_writes_nothing_and_renewal_fails(store):
    from lucid_core.runtime.store.schema import SchedulerStateRow

    old = lease.acquire(store, "a", ttl_s=2, now=100.0)
    stale = store.fenced(old, clock=lambda: 101.0)
    stale.set_state("written_by", "a")  # still current: the write lands and renews the lease to 103
    assert lease.holder_of(store, 102.5) == "a"
    new = lease.acquire(store, "b", ttl_s=10, now=104.0)  # a stalled past its TTL; b takes over
    with pytest.raises(lease.Fenced, match="taken over"):
        stale.set_state("written_by", "a-late")
    with pytest.raises(lease.Fenced), stale.session() as s:
        s.add(SchedulerStateRow(key="other", value=1))
    with pytest.raises(lease.Fenced):
        lease.renew(store, old, now=105.0)
    assert store.get_state("written_by") == "a" and store.get_state("other") is None
    assert stale.get_state("written_by") == "a"  # reads are not fenced
    store.fenced(new, clock=lambda: 105.0).set_state("written_by", "b")
    lease.release(store, old)  # giving back a lost take leaves the new holder's lease alone
    assert lease.holder_of(store, 106.0) == "b" and store.get_state("written_by") == "b"


def test_admin_lease_waits_for_a_round_then_refuses(store):
    round_lease = lease.acquire(store, "round", ttl_s=60)
    with pytest.raises(lease.LeaseHeld, match="round"), lease.admin_lease(store, "remove h", wait_s=0.3):
        pass
    lease.release(store, round_lease)
    with lease.admin_lease(store, "remove h", wait_s=0.3) as fenced:
        fenced.set_state("admin", True)
        assert lease.holder_of(store).startswith("admin:")
    assert lease.holder_of(store) is None and store.get_state("admin") is True


def test_the_lease_runs_on_the_databases_clock(store):
    """Without a `now`, expiry is written and judged by the database's clock, which agrees with this
    machine's here (SQLite's is the machine's; the test PostgreSQL server runs beside it)."""
    import time as _time

    import sqlalchemy as sa

    from lucid_core.runtime.store.db_clock import database_now
    from lucid_core.runtime.store.schema import LeaseRow

    with store.engine.connect() as conn:
        read = conn.execute(sa.select(database_now(store.dialect))).scalar_one()
    assert abs(read - _time.time()) < 5.0
    taken = lease.acquire(store, "a", ttl_s=30)
    with store.session() as s:
        expires = s.get(LeaseRow, lease.ROUND_LEASE).expires_at
    assert abs(expires - (_time.time() + 30)) < 5.0
    assert lease.holder_of(store) == "a" and lease.acquire(store, "b", ttl_s=30) is None
    lease.renew(store, taken)
    assert lease.holder_of(store, now=expires + 60) is None  # judged at a time past it, it has lapsed
    with pytest.raises(ValueError, match="mysql"):
        database_now("mysql")


def test_inventory_add_list_drain_remove(store):
    _hosts(store)
    with pytest.raises(InventoryError, match="already exists"):
        add_host(store, HostSpec("m0", executor="local", gpus=1))
    with pytest.raises(InventoryError, match="pool"):
        add_host(store, HostSpec("x", executor="local", pool="gpu", gpus=1))
    drain_host(store, "m1")
    rows = {h["name"]: h for h in list_hosts(store)}
    assert rows["m1"]["draining"] and rows["m0"]["gpus"] == 4 and rows["p0"]["pool"] == "profiling"
    remove_host(store, "m1")
    assert {h["name"] for h in list_hosts(store)} == {"m0", "p0"}
    with pytest.raises(InventoryError, match="no host"):
        remove_host(store, "m1")


def test_upgrade_from_the_first_schema_keeps_the_data(tmp_path):
    from alembic import command

    from lucid_core.runtime.store.store import _alembic_config

    url = f"sqlite:///{tmp_path / 'old.db'}"
    old = Store(url, migrate=False)
    with old.engine.begin() as conn:
        command.upgrade(_alembic_config(conn), "0001")
        conn.execute(sa.text("INSERT INTO hosts (name, address, port, user, vc, pool, executor, telemetry, workdir, "
                             "python, gpu_memory_mb, draining, reachable, added_at) VALUES ('h', '127.0.0.1', 22, "
                             "'', 'vc-a', 'main', 'local', 'nvml', '/tmp', 'python3', 1.0, 0, 1, 0.0)"))
    old.dispose()
    new = Store(url)
    assert new.revision() == HEAD
    hosts = list_hosts(new)
    assert [h["name"] for h in hosts] == ["h"]
    with new.session() as s:
        from lucid_core.runtime.store.schema import HostRow

        assert s.get(HostRow, "h").cooldown_until is None
        assert s.get(HostRow, "h").run_as == "account"  # hosts added before 0004 keep today's behaviour
    run_columns = {c["name"] for c in sa.inspect(new.engine).get_columns("runs")}
    assert {"observed_speed", "observed_speed_at", "observed_speed_samples", "observed_speed_emulated"} <= run_columns
    new.dispose()


def test_racing_holders_never_both_win_the_lease(store):
    import threading

    results: list[list[bool]] = []
    for contest in range(15):
        now = 1000.0 * (contest + 1)  # each contest starts after the previous lease lapsed
        barrier = threading.Barrier(3)
        won = [False, False, False]

        def take(i: int, now: float = now, barrier: threading.Barrier = barrier, won: list = won) -> None:
            barrier.wait()
            won[i] = lease.acquire(store, f"holder-{i}", ttl_s=100, now=now) is not None

        threads = [threading.Thread(target=take, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        results.append(won)
    assert all(sum(won) == 1 for won in results), results


def test_a_bare_postgresql_url_uses_the_installed_driver(pg_url):
    from lucid_core.runtime.store.store import with_installed_driver

    bare = "postgresql://" + pg_url.split("://", 1)[1]
    assert with_installed_driver(bare).startswith(("postgresql+psycopg2://", "postgresql+psycopg://"))
    assert with_installed_driver("sqlite:///x.db") == "sqlite:///x.db"
    assert with_installed_driver("postgresql+psycopg2://h/db") == "postgresql+psycopg2://h/db"
    store = Store(bare)  # before: "No module named 'psycopg'" with only psycopg2 installed
    assert store.revision() == HEAD
    store.dispose()


@pytest.mark.parametrize(("field", "value", "shown"), [
    ("name", "a\nb", "'\\n' at character 2"), ("user", "u\x1b[31mred", "'\\x1b' at character 2"),
    ("vc", "vc-a\t", "'\\t' at character 5"), ("name", "del\x7f", "'\\x7f' at character 4"),
    ("user", "u\x85", "'\\x85' at character 2"), ("name", "\r", "'\\r' at character 1"),
])
def test_a_control_character_in_name_user_or_vc_is_refused_and_nothing_stored(field, value, shown, store):
    _hosts(store)
    request = JobRequest("train", 1, **{"user": "u", "vc": "vc-a", "name": "n", field: value})
    with pytest.raises(SubmissionError) as info:
        submit(store, request)
    assert info.value.errors[field] == ("must not contain control characters (newlines, tabs, escapes), "
                                        f"got {shown}")
    from lucid_core.runtime.surfaces.queries import status

    with pytest.raises(UnknownJob):
        status(store, "j000001")


def test_a_command_keeps_its_newlines_and_tabs(store):
    _hosts(store)
    job = submit(store, JobRequest("echo a\n\techo b", 1, "u", "vc-a", name="two lines"))
    from lucid_core.runtime.surfaces.queries import status

    assert status(store, job)["command"] == "echo a\n\techo b"


def test_submit_cli_refuses_an_escape_in_user_in_one_line_and_queue_stays_clean(tmp_path, capsys):
    from lucid_core.cli import main

    store_url = f"sqlite:///{tmp_path / 'lucid.db'}"  # the CLI's answer does not depend on the backend
    store = Store(store_url)
    _hosts(store)
    store.dispose()
    code = main(["submit", "--store", store_url, "--gpus", "1", "--vc", "vc-a", "--name", "a\nb",
                 "--user", "u\x1b[31mred", "--", "true"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "\x1b" not in err and "\n" not in err.strip(), err
    assert "name: must not contain control characters" in err and "user: must not contain control" in err
    assert main(["queue", "--store", store_url]) == 0
    assert "\x1b" not in capsys.readouterr().out


def test_a_promotion_is_dated_by_the_databases_clock(store, monkeypatch):
    """The round learns the jobs that ended after a promotion by comparing their end times (the database's
    clock) with the promotion's: a worker whose clock runs an hour ahead must not date it an hour late."""
    import time as _time

    from lucid_core.runtime.store.schema import ModelVersionRow
    from lucid_core.runtime.store.store import record_promotion

    real = _time.time()
    monkeypatch.setattr(_time, "time", lambda: real + 3600.0)
    with store.session() as s:
        record_promotion(s, "duration", "1", "/nonexistent/model.joblib", {}, "by a skewed worker")
    with store.session() as s:
        dated = s.scalar(sa.select(ModelVersionRow.created_at))
    assert abs(dated - real) < 60.0


def test_an_expiry_no_take_could_write_does_not_hold_the_lease(store):
    """Another controller's bad write (an expiry 10^18 s ahead) held the lease for ever: every round did nothing."""
    from lucid_core.runtime.store.schema import LeaseRow

    assert lease.acquire(store, "rogue", ttl_s=30)
    with store.session() as s:
        s.execute(sa.update(LeaseRow).values(expires_at=1e18))
    assert lease.holder_of(store) is None
    assert lease.acquire(store, "round", ttl_s=30) is not None and lease.holder_of(store) == "round"
    with pytest.raises(ValueError, match="TTL"):
        lease.acquire(store, "round", ttl_s=1e9)


@pytest.mark.parametrize("edited", ["'x'", "2.5", "-7"])
def test_a_hand_edited_sequence_number_does_not_stop_submissions(tmp_path, edited):
    """SQLite keeps text in `seq`, and orders it above every number: the next id was `'x' + 1`, a TypeError for
    every submission after it. Text is passed over, a float rounds down, and an id still taken by the
    edited job is passed over too."""
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    add_host(store, HostSpec("m0", executor="local", telemetry="emulated", gpus=2, vc="a", workdir=str(tmp_path)))
    first = [submit(store, JobRequest("true", gpus=1, user="ana", vc="a")) for _ in range(3)]
    with store.engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE jobs SET seq = {edited} WHERE job_id = :j"), {"j": first[-1]})
    after = [submit(store, JobRequest("true", gpus=1, user="ana", vc="a")) for _ in range(2)]
    assert first == ["j000001", "j000002", "j000003"] and after == ["j000004", "j000005"]  # j000003 is still taken
    store.dispose()


def test_a_sequence_number_edited_to_the_columns_largest_value_does_not_stop_submissions(store):
    """On either store (PostgreSQL's column is a 4-byte integer): a job whose seq a hand edit set to 2**31 - 1 or
    to a negative number leaves later submissions their next numbers and fresh ids (2**31 overflowed every one)."""
    add_host(store, HostSpec("m0", executor="local", telemetry="emulated", gpus=2, vc="a", workdir="/tmp/m0"))
    for edited in (2**31 - 1, -7):
        before = [submit(store, JobRequest("true", gpus=1, user="ana", vc="a")) for _ in range(2)]
        with store.engine.begin() as conn:
            conn.execute(sa.text("UPDATE jobs SET seq = :v WHERE job_id = :j"), {"v": edited, "j": before[-1]})
        after = [submit(store, JobRequest("true", gpus=1, user="ana", vc="a")) for _ in range(2)]
        assert len(set(before + after)) == 4 and all(len(j) == 7 for j in after), (edited, before, after)
