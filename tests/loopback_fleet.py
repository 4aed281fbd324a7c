"""A fleet of GPU host entries on loopback for tests and benchmarks: real sshd servers, a silent port, a slow link.

- `SshdFleet`: a few sshd processes on their own ports (per-run host keys, one client key, a
  known_hosts file); many host entries can share one server, each with its own work directory.
- `SilentPort`: a loopback port that accepts TCP connections and never says a word (a hung host).
- `DelayedLink`: a loopback port that forwards to another (an sshd) and holds every chunk of
  traffic `delay_s` before passing it on, so each SSH round trip is slower (a slow host, real sshd
  behind it).
"""

from __future__ import annotations

import contextlib
import getpass
import os
import shutil
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_port(port: int, timeout: float = 10.0) -> bool:
    """True once something listens on 127.0.0.1:port."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def sshd_available() -> bool:
    return os.path.exists(SSHD) and shutil.which("ssh-keygen") is not None


@dataclass
class SshdFleet:
    """`servers` sshd processes on 127.0.0.1; `port_of(i)` spreads host entries over them."""

    root: Path
    servers: int = 2
    ports: list[int] = field(default_factory=list)
    client_key: Path | None = None
    known_hosts: Path | None = None
    user: str = field(default_factory=getpass.getuser)
    read_rc: bool = False  # let bash read the account's ~/.bashrc on each login (it is skipped by default)
    _processes: list[subprocess.Popen] = field(default_factory=list)
    _known: list[str] = field(default_factory=list)

    def start(self) -> SshdFleet:
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        self.root.mkdir(parents=True, exist_ok=True)
        self.client_key = self.root / "client_ed25519"
        _keygen(self.client_key)
        authorized = self.root / "authorized_keys"
        authorized.write_text(Path(f"{self.client_key}.pub").read_text())
        for index in range(self.servers):
            key = self.root / f"host_key_{index}"
            _keygen(key)
            port = free_port()
            config = self.root / f"sshd_{index}.conf"
            config.write_text("\n".join([
                f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {key}",
                f"PidFile {self.root / f'sshd_{index}.pid'}",
                f"AuthorizedKeysFile {authorized}", "UsePAM no", "StrictModes no", "PasswordAuthentication no",
                "KbdInteractiveAuthentication no", "PubkeyAuthentication yes", "PermitRootLogin yes",
                "MaxSessions 100", "MaxStartups 2000", "UseDNS no", "LogLevel ERROR",
                # bash started by sshd reads ~/.bashrc unless it is a nested shell; this box's root .bashrc
                # runs `pyenv init`, whose rehash lock serialises hundreds of logins: the fleet's hosts are
                # plain accounts (--login-rc in bench_fleet.py measures with the rc files read)
                *([] if self.read_rc else ["SetEnv SHLVL=1"]), ""]))
            self._processes.append(subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)],
                                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            if not wait_port(port):
                raise RuntimeError(f"sshd {index} did not listen on {port}")
            self.ports.append(port)
            self._known.append(f"{' '.join(Path(f'{key}.pub').read_text().split()[:2])}")
        self.known_hosts = self.root / "known_hosts"
        self.write_known_hosts()
        return self

    def port_of(self, index: int) -> int:
        return self.ports[index % len(self.ports)]

    def write_known_hosts(self, aliases: dict[int, int] | None = None) -> None:
        """known_hosts for every server, plus `aliases` (a forwarding port -> the server index behind it)."""
        lines = [f"[127.0.0.1]:{port} {self._known[i]}" for i, port in enumerate(self.ports)]
        lines += [f"[127.0.0.1]:{port} {self._known[i]}" for port, i in (aliases or {}).items()]
        assert self.known_hosts is not None
        self.known_hosts.write_text("\n".join(lines) + "\n")

    def stop(self) -> None:
        for process in self._processes:
            process.kill()
            process.wait(timeout=10)
        self._processes.clear()


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


class SilentPort:
    """Accepts connections on a loopback port and never answers (a host whose sshd hangs)."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.port = self._listener.getsockname()[1]
        self._held: list[socket.socket] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self._held.append(conn)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        for conn in self._held:
            conn.close()


class DelayedLink:
    """Forwards 127.0.0.1:port to 127.0.0.1:target, holding each chunk `delay_s` in each direction."""

    def __init__(self, target: int, delay_s: float) -> None:
        self.target, self.delay_s = target, delay_s
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.port = self._listener.getsockname()[1]
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                inbound, _ = self._listener.accept()
            except OSError:
                return
            outbound = socket.create_connection(("127.0.0.1", self.target))
            for src, dst in ((inbound, outbound), (outbound, inbound)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                time.sleep(self.delay_s)
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        self._closed = True
        self._listener.close()
