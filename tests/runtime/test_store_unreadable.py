"""A store that cannot be read (its server down, a wrong database, never set up) is said as such by the HTTP API:
a JSON 503 naming where the store is (never its password), why, and what to do, not a bare 500."""

from __future__ import annotations

import socket

import pytest
from fastapi.testclient import TestClient

from lucid_core.runtime.store.store import Store
from lucid_core.runtime.surfaces.api import create_app

PASSWORD = "Pw-unreadable-7c1e"  # a recognisable secret: it must never show up in an answer
ROUTES = ("/queue", "/history", "/hosts", "/metrics", "/jobs/j000001", "/jobs/j000001/logs", "/jobs/j000001/explain")


def closed_port() -> int:
    """A loopback port nothing listens on (bound once to find it free, then closed): connections are refused."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def unopened_api(url: str) -> TestClient:
    """The API over the store at `url`, opened without migrating it (as the Airflow plugin opens it)."""
    return TestClient(create_app(url, store=Store(url, migrate=False)), raise_server_exceptions=False)


def test_an_unreachable_store_is_a_json_503_naming_it_without_its_password():
    port = closed_port()
    client = unopened_api(f"postgresql+psycopg2://lucid:{PASSWORD}@127.0.0.1:{port}/lucid")
    for path in ROUTES:
        reply = client.get(path)
        assert reply.status_code == 503 and reply.headers["content-type"] == "application/json", (path, reply.text)
        detail = reply.json()["detail"]
        assert detail.startswith(f"The Lucid store at 127.0.0.1:{port}/lucid cannot be read: "), detail
        assert "refused" in detail and "names the right host and database" in detail, detail
        assert PASSWORD not in reply.text and "lucid:" not in reply.text, reply.text
    submitted = client.post("/jobs", json={"command": "true", "gpus": 1, "vc": "a"})
    assert submitted.status_code == 503 and "cannot be read" in submitted.json()["detail"]


def _not_set_up(client: TestClient, place: str) -> None:
    """Every route answers 503 saying the store has no tables yet and how to create them."""
    for path in ROUTES:
        reply = client.get(path)
        assert reply.status_code == 503, (path, reply.status_code, reply.text)
        detail = reply.json()["detail"]
        assert detail.startswith(f"The Lucid store at {place} is not set up yet: it has no tables ("), detail
        assert detail.endswith("run the lucid_scheduling_round DAG once or any `lucid` command, which create them.")


def test_a_store_never_set_up_is_a_json_503_saying_how_to_set_it_up(tmp_path):
    path = tmp_path / "empty.db"
    _not_set_up(unopened_api(f"sqlite:///{path}"), str(path))


@pytest.mark.postgres
def test_a_postgresql_store_never_set_up_is_a_json_503_saying_how_to_set_it_up(empty_pg_url):
    from sqlalchemy.engine import make_url

    url = make_url(empty_pg_url)
    _not_set_up(unopened_api(empty_pg_url), f"{url.host}:{url.port}/{url.database}")


def test_other_database_errors_stay_server_errors(tmp_path):
    """Only a store that cannot be read is a 503: a bad statement is a fault of the code, a 500."""
    from sqlalchemy.exc import IntegrityError, ProgrammingError

    from lucid_core.runtime.store.unreadable import unreadable_words

    url = f"postgresql+psycopg2://lucid:{PASSWORD}@db.example:5432/lucid"
    assert unreadable_words(url, IntegrityError("INSERT", {}, Exception("UNIQUE constraint failed"))) is None
    assert unreadable_words(url, ProgrammingError("SELECT", {}, Exception("syntax error"))) is None


def test_sqlite_errors_that_are_no_outage_are_not_called_one():
    """Every SQLite OperationalError was called a store that cannot be read, advising to check its server: a
    column missing after an upgrade (the plugin no longer migrates) says the store is older than the code, a locked
    database that it is busy, a statement's own fault stays a 500."""
    import sqlite3

    from sqlalchemy.exc import OperationalError

    from lucid_core.runtime.store.unreadable import unreadable_words

    url = "sqlite:////srv/lucid/lucid.db"

    def words(message: str) -> str | None:
        return unreadable_words(url, OperationalError("SELECT", {}, sqlite3.OperationalError(message)))

    assert words("no such column: jobs.time_limit_s").startswith(
        "The Lucid store at /srv/lucid/lucid.db was set up by an older version of Lucid (no such column")
    assert "is busy (database is locked)" in words("database is locked")
    assert words('near "SELEC": syntax error') is None
    assert "cannot be read: unable to open database file" in words("unable to open database file")
    assert "is not set up yet" in words("no such table: jobs")
