"""Fixtures of the runtime tests (the shared ones, `sshd_hosts` and `store`, come from tests/conftest.py)."""

from __future__ import annotations

import pytest
from runtime_helpers import fast_config, jobs_by_id, one_round, register

from lucid_core.runtime.store.store import Store
from lucid_core.runtime.surfaces.submission import cancel


@pytest.fixture
def live(sshd_hosts, tmp_path):
    """A store over the session's sshd hosts (prof0, main0, main1); afterwards every job still active is cancelled
    and a round run, so no test leaves a job process behind."""
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    register(store, sshd_hosts, tmp_path / "hosts")
    yield store, sshd_hosts, tmp_path
    for job_id, row in jobs_by_id(store).items():
        if row.state not in ("COMPLETED", "FAILED", "CANCELLED"):
            cancel(store, job_id)
    try:
        one_round(store, sshd_hosts, fast_config())
    finally:
        store.dispose()
