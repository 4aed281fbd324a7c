"""Inputs checked against the real fleet (issue 18): hosts of any size the inventory accepts are used as
they are, a job no set of its VC's hosts can ever hold is refused at submit with the reason, a job the
profiling pool can never hold is profiled in its run, a wide job takes whole hosts; idempotency keys
are scoped by user as a pair of columns."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa
from runtime_helpers import SETTINGS, fast_config, jobs_by_id, runs_of

from lucid_core.runtime.hosts.inventory import HostSpec, add_host
from lucid_core.runtime.hosts.local_executor import local_executor
from lucid_core.runtime.round.scheduling_round import SchedulingRound
from lucid_core.runtime.store.store import Store
from lucid_core.runtime.surfaces.submission import JobRequest, SubmissionError, submit

TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")


def rounds(store: Store, done, config, timeout_s: float = 30.0) -> None:
    """Rounds until `done(jobs)`; a round that raises fails the test."""
    deadline = time.monotonic() + timeout_s
    while not done(jobs_by_id(store)):
        report = SchedulingRound(store, local_executor(), config, SETTINGS).run()
        assert not report.errors, report.errors
        assert time.monotonic() < deadline, {j: (r.state, r.pending_reason) for j, r in jobs_by_id(store).items()}
        time.sleep(0.1)


def test_a_host_wider_than_the_configured_node_size_is_used_not_a_round_breaker(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    add_host(store, HostSpec("big0", executor="local", vc="vc-a", telemetry="emulated", gpus=16,
                             workdir=str(tmp_path / "big0")))
    config = fast_config(**{"cluster.gpus_per_node": 8, "profiler.enabled": False})
    wide = submit(store, JobRequest("true", 12, "u", "vc-a"))
    rounds(store, lambda jobs: jobs[wide].state in TERMINAL, config)
    assert jobs_by_id(store)[wide].state == "COMPLETED"
    assert sorted(runs_of(store, wide)[0].gpu_indices) == list(range(12))
    store.dispose()


def test_a_wide_job_on_small_hosts_is_profiled_in_its_run_and_placed_over_whole_hosts(tmp_path):
    """Two 2-GPU main hosts and a 2-GPU profiling host: a 4-GPU job cannot be profiled on the pool, so it
    is placed at once, over both main hosts whole, with its profiling window in its run."""
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    for name, pool in (("prof0", "profiling"), ("main0", "main"), ("main1", "main")):
        add_host(store, HostSpec(name, executor="local", vc="vc-a", pool=pool, telemetry="emulated", gpus=2,
                                 workdir=str(tmp_path / name)))
    wide = submit(store, JobRequest("sleep 2", 4, "u", "vc-a"))
    rounds(store, lambda jobs: jobs[wide].state in TERMINAL, fast_config(**{"binder.sharing": "off"}))
    job = jobs_by_id(store)[wide]
    assert job.state == "COMPLETED", job.end_reason
    runs = runs_of(store, wide)
    assert [r.kind for r in runs] == ["main", "main"]  # no profiling run: the pool could never hold it
    assert sorted((r.host, tuple(r.gpu_indices)) for r in runs) == [("main0", (0, 1)), ("main1", (0, 1))]
    assert runs[0].profile_in_place
    store.dispose()


def test_submit_refuses_a_job_no_set_of_its_vcs_hosts_can_hold_and_says_why(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    for name, gpus in (("a0", 4), ("a1", 2), ("a2", 2)):
        add_host(store, HostSpec(name, executor="local", vc="vc-a", gpus=gpus, workdir=str(tmp_path / name)))
    submit(store, JobRequest("true", 4, "u", "vc-a"))  # one 4-GPU host
    submit(store, JobRequest("true", 6, "u", "vc-a"))  # the 4-GPU host whole and a 2-GPU one
    with pytest.raises(SubmissionError) as refused:
        submit(store, JobRequest("true", 8, "u", "vc-a"))  # 8 GPUs in the VC, but only one 4-GPU host
    assert list(refused.value.errors) == ["gpus"]
    said = refused.value.errors["gpus"]
    assert "can never be placed in VC vc-a" in said and "4, 2, 2" in said and "whole 4-GPU hosts (1" in said
    store.dispose()


def test_idempotency_keys_are_scoped_by_user_as_a_pair_not_a_joined_string(tmp_path):
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    add_host(store, HostSpec("m0", executor="local", vc="vc-a", gpus=1, workdir=str(tmp_path / "m0")))
    # a user name may no longer hold the old joint's \x1f (no control character); a key still may
    with pytest.raises(SubmissionError, match="control characters"):
        submit(store, JobRequest("true", 1, "a\x1fb", "vc-a", idempotency_key="c"))
    first = submit(store, JobRequest("true", 1, "ab", "vc-a", idempotency_key="c"))
    second = submit(store, JobRequest("true", 1, "a", "vc-a", idempotency_key="b\x1fc"))
    third = submit(store, JobRequest("true", 1, "a", "vc-a", idempotency_key="bc"))
    assert len({first, second, third}) == 3  # "ab" + "c" and "a" + "bc" join the same way without a separator
    assert submit(store, JobRequest("true", 1, "a", "vc-a", idempotency_key="b\x1fc")) == second
    assert submit(store, JobRequest("true", 1, "ab", "vc-a", idempotency_key="c")) == first
    other_user = submit(store, JobRequest("true", 1, "z", "vc-a", idempotency_key="c"))
    assert other_user not in (first, second)
    # the store itself refuses a second row for one (user, key)
    with store.engine.begin() as conn, pytest.raises(sa.exc.IntegrityError):
        conn.execute(sa.text("INSERT INTO jobs (job_id, seq, name, user, vc, gpus, command, env, "
                             "idempotency_key, amp, long_cold_start, state, submit_time, known_min_duration, "
                             "no_share, attempts, profiled, profile_emulated, ended_in_profiling, "
                             "cancel_requested) VALUES ('x', 99, '', 'z', 'vc-a', 1, 'true', '{}', 'c', 0, 0, "
                             "'SUBMITTED', 0, 0, 0, 0, 0, 0, 0, 0)"))
    store.dispose()


def test_the_migration_moves_stored_keys_to_the_pair(tmp_path):
    from alembic import command

    from lucid_core.runtime.store.schema import JobRow
    from lucid_core.runtime.store.store import _alembic_config

    url = f"sqlite:///{tmp_path / 'old.db'}"
    old = Store(url, migrate=False)
    with old.engine.begin() as conn:
        command.upgrade(_alembic_config(conn), "0005")
        conn.execute(sa.text("INSERT INTO jobs (job_id, seq, name, user, vc, gpus, command, env, idempotency_key, "
                             "amp, long_cold_start, state, submit_time, known_min_duration, no_share, attempts, "
                             "profiled, profile_emulated, ended_in_profiling, cancel_requested) VALUES "
                             "('j000001', 1, '', 'ann', 'vc-a', 1, 'true', '{}', 'ann\x1fkey-1', 0, 0, "
                             "'SUBMITTED', 0, 0, 0, 0, 0, 0, 0, 0)"))
    old.dispose()
    new = Store(url)
    with new.session() as s:
        assert s.get(JobRow, "j000001").idempotency_key == "key-1"
    add_host(new, HostSpec("m0", executor="local", vc="vc-a", gpus=1, workdir=str(tmp_path / "m0")))
    assert submit(new, JobRequest("true", 1, "ann", "vc-a", idempotency_key="key-1")) == "j000001"
    new.dispose()
