"""Shared fixtures: real sshd hosts on loopback, a throwaway PostgreSQL database, a store.

- `sshd_hosts`: three sshd servers on 127.0.0.1 (`prof0` profiling, `main0`/`main1` main), each
  with its own per-run host key and port, one client key, and a known_hosts file listing them.
  Each `SshdHost` can be stopped and started again on the same port with the same key.
- `pg_url`: a database created for the test session on 127.0.0.1:5432 (user postgres) and dropped after.
- `store_url` / `store`: parametrized over SQLite and PostgreSQL.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

SSHD = "/usr/sbin/sshd"
PG_ADMIN_URL = os.environ.get("LUCID_TEST_PG_ADMIN", "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_port(port: int, up: bool, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                if up:
                    return True
        except OSError:
            if not up:
                return True
        time.sleep(0.05)
    return False


@dataclass
class SshdHost:
    name: str
    port: int
    config: Path
    host_key: Path
    workdir: Path
    process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen([SSHD, "-D", "-e", "-f", str(self.config)],
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if not _wait_port(self.port, up=True):
            raise RuntimeError(f"sshd for {self.name} did not listen on {self.port}")

    def stop(self) -> None:
        """Kill this sshd (its listener only; detached jobs started through it keep running)."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None
            _wait_port(self.port, up=False)


@dataclass
class SshCluster:
    hosts: dict[str, SshdHost]
    client_key: Path
    known_hosts: Path
    user: str
    root: Path


def _sshd_config(root: Path, name: str, port: int, host_key: Path, authorized: Path) -> Path:
    config = root / f"sshd_{name}.conf"
    config.write_text("\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {host_key}", f"PidFile {root / f'sshd_{name}.pid'}",
        f"AuthorizedKeysFile {authorized}", "UsePAM no", "StrictModes no", "PasswordAuthentication no",
        "KbdInteractiveAuthentication no", "PubkeyAuthentication yes", "PermitRootLogin yes",
        "MaxSessions 50", "MaxStartups 50", "LogLevel ERROR", "",
    ]))
    return config


@pytest.fixture(scope="session")
def sshd_hosts(tmp_path_factory: pytest.TempPathFactory) -> SshCluster:
    if not os.path.exists(SSHD) or shutil.which("ssh-keygen") is None:
        pytest.skip(f"openssh-server not installed ({SSHD} missing): apt-get install openssh-server")
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)
    root = tmp_path_factory.mktemp("sshd")
    client_key = root / "client_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(client_key)], check=True)
    authorized = root / "authorized_keys"
    authorized.write_text((root / "client_ed25519.pub").read_text())
    known_lines = []
    hosts = {}
    for name in ("prof0", "main0", "main1"):
        key = root / f"host_{name}"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
        port = _free_port()
        known_lines.append(f"[127.0.0.1]:{port} {Path(str(key) + '.pub').read_text().split(' ')[0]} "
                           f"{Path(str(key) + '.pub').read_text().split(' ')[1]}")
        workdir = root / f"runs_{name}"
        host = SshdHost(name, port, _sshd_config(root, name, port, key, authorized), key, workdir)
        host.start()
        hosts[name] = host
    known_hosts = root / "known_hosts"
    known_hosts.write_text("\n".join(known_lines) + "\n")
    import getpass

    cluster = SshCluster(hosts, client_key, known_hosts, getpass.getuser(), root)
    yield cluster
    for host in hosts.values():
        host.stop()


@pytest.fixture(scope="session")
def pg_url() -> str:
    try:
        import sqlalchemy as sa

        admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            name = f"lucid_test_{uuid.uuid4().hex[:10]}"
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    except Exception as exc:  # no server, no driver, no rights
        pytest.skip(f"PostgreSQL not available at {PG_ADMIN_URL}: {exc}")
    yield PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def emptied(url: str) -> str:
    """`url`'s database with nothing in its public schema (what an earlier test of this worker made is dropped)."""
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(sa.text("DROP SCHEMA public CASCADE"))
        conn.execute(sa.text("CREATE SCHEMA public"))
    engine.dispose()
    return url


@pytest.fixture
def empty_pg_url(pg_url: str) -> str:
    """The session's PostgreSQL database, emptied for this test (`pg_url` is shared by a worker's tests)."""
    return emptied(pg_url)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, empty store URL on each backend (PostgreSQL: a schema-clean database per test)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'lucid.db'}"
    return emptied(request.getfixturevalue("pg_url"))  # drop what an earlier test left behind


@pytest.fixture
def store(store_url: str):
    from lucid_core.runtime.store.store import Store

    s = Store(store_url)
    yield s
    s.dispose()
