"""Fixtures of the reliability tests: a throwaway PostgreSQL server we may restart, and the runtime helpers.

The shared fixtures (`sshd_hosts`, `pg_url`, `store`) come from tests/conftest.py; the runtime tests'
helpers (tests/runtime/runtime_helpers.py) are put on the import path so the live-cluster loop is
the same one the runtime's own tests use.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "runtime"))

PG_BIN_DIRS = ["/usr/local/bin", *sorted(str(p) for p in Path("/usr/lib/postgresql").glob("*/bin"))]
PG_PASSWORD = "pg-S3cret-Reliability-9f2c"  # a recognisable secret: it must never show up anywhere


def _pg_tool(name: str) -> str | None:
    for directory in PG_BIN_DIRS:
        candidate = Path(directory) / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    return shutil.which(name)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class ThrowawayPostgres:
    """A private PostgreSQL server (initdb + pg_ctl) on a free loopback port, password auth."""

    root: Path
    port: int
    pg_ctl: str
    run_as: list[str]

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def url(self) -> str:
        return f"postgresql+psycopg2://lucid:{PG_PASSWORD}@127.0.0.1:{self.port}/postgres"

    def _ctl(self, *args: str) -> None:
        subprocess.run([*self.run_as, self.pg_ctl, "-D", str(self.data), "-w", "-t", "30",
                        "-l", str(self.root / "server.log"), *args], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def start(self) -> None:
        self._ctl("-o", f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off", "start")

    def stop(self) -> None:
        self._ctl("-m", "fast", "stop")

    def restart(self) -> None:
        """Stop (fast: every open connection is cut) and start again on the same port."""
        self.stop()
        self.start()


@pytest.fixture(scope="session")
def throwaway_pg() -> ThrowawayPostgres:
    """Our own PostgreSQL instance (never the machine's shared server), so tests may restart it."""
    initdb, pg_ctl = _pg_tool("initdb"), _pg_tool("pg_ctl")
    if initdb is None or pg_ctl is None:
        pytest.skip("PostgreSQL server binaries (initdb, pg_ctl) not found in /usr/local/bin or "
                    "/usr/lib/postgresql/*/bin: apt-get install postgresql")
    run_as: list[str] = []
    root = Path(tempfile.mkdtemp(prefix="lucid-pg-"))
    if os.geteuid() == 0:  # postgres refuses to run as root: run it as the postgres account
        import pwd

        try:
            account = pwd.getpwnam("postgres")
        except KeyError:
            shutil.rmtree(root)
            pytest.skip("running as root and there is no 'postgres' account to run a throwaway server as")
        os.chown(root, account.pw_uid, account.pw_gid)
        run_as = ["runuser", "-u", "postgres", "--"]
    pwfile = root / "pw"
    pwfile.write_text(PG_PASSWORD + "\n")
    if run_as:
        os.chown(pwfile, pwd.getpwnam("postgres").pw_uid, -1)
    subprocess.run([*run_as, initdb, "-D", str(root / "data"), "-U", "lucid", f"--pwfile={pwfile}",
                    "--auth=scram-sha-256", "-E", "UTF8", "--no-sync"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    pwfile.unlink()
    server = ThrowawayPostgres(root, _free_port(), pg_ctl, run_as)
    server.start()
    yield server
    try:
        server.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def fresh_pg_store(throwaway_pg: ThrowawayPostgres):
    """A Store on the throwaway server with an empty schema."""
    import sqlalchemy as sa

    from lucid_core.runtime.store.store import Store

    engine = sa.create_engine(throwaway_pg.url)
    for _ in range(50):  # the server may still be coming back from an earlier test's restart
        try:
            with engine.begin() as conn:
                conn.execute(sa.text("DROP SCHEMA public CASCADE"))
                conn.execute(sa.text("CREATE SCHEMA public"))
            break
        except sa.exc.OperationalError:
            time.sleep(0.2)
    engine.dispose()
    store = Store(throwaway_pg.url)
    yield store
    store.dispose()


@pytest.fixture
def live(sshd_hosts, tmp_path):
    """A store over the session's sshd hosts (prof0, main0, main1); afterwards every host is brought back, every
    job still active cancelled and a round run, so no test leaves a process or a stopped sshd to the next."""
    from lucid_invariants import TERMINAL
    from runtime_helpers import fast_config, jobs_by_id, one_round, register

    from lucid_core.runtime.store.store import Store
    from lucid_core.runtime.surfaces.submission import cancel

    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    register(store, sshd_hosts, tmp_path / "hosts")
    yield store, sshd_hosts, tmp_path
    for host in sshd_hosts.hosts.values():  # the hosts are shared by the session: bring them all back
        if host.process is None:
            host.start()
    for job_id, row in jobs_by_id(store).items():
        if row.state not in TERMINAL:
            cancel(store, job_id)
    try:
        one_round(store, sshd_hosts, fast_config())
    finally:
        store.dispose()
