"""SSH transport (paramiko): verified host keys, one connection per host kept across calls, retries.

Host keys are checked against a known_hosts file and unknown hosts are refused
(paramiko's RejectPolicy). A connection is opened on first use and reused until `close()`
(a round that owns its executor closes it at its end; a long-lived round loop keeps it across
rounds). Each call has a deadline that covers connecting, retries and the script together, so a
host that accepts TCP and never speaks costs one deadline; connection failures are retried with a
short backoff while the deadline allows; a rejected host key is never retried. Calls to different
hosts may run in different threads at once (one host's calls are made one at a time).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import paramiko

from lucid_core.runtime.hosts.executor import (
    HostAddress,
    HostExecutor,
    HostKeyRejected,
    HostUnreachable,
    ScriptResult,
)
from lucid_core.runtime.hosts.local_executor import LocalTransport
from lucid_core.runtime.hosts.ssh_shell import KeptShell, ShellClosed, ShellSilent

_RETRYABLE = (OSError, EOFError, paramiko.SSHException, socket.timeout)
IDLE_CHECK_S = 1.0  # how often a kept connection's reader thread wakes while nothing arrives


def default_known_hosts() -> str:
    """LUCID_KNOWN_HOSTS, else ~/.ssh/known_hosts."""
    return os.environ.get("LUCID_KNOWN_HOSTS") or str(Path.home() / ".ssh" / "known_hosts")


class SshTransport:
    def __init__(self, known_hosts: str | None = None, *, connect_timeout_s: float = 10.0,
                 retries: int = 2, backoff_s: float = 0.5) -> None:
        self.known_hosts = known_hosts or default_known_hosts()
        self.connect_timeout_s = connect_timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self._clients: dict[str, paramiko.SSHClient] = {}
        self._shells: dict[str, KeptShell] = {}
        self._host_locks: dict[str, threading.Lock] = {}
        self._lock = threading.Lock()
        self.connects = 0  # connections opened (for tests of reuse)

    def _connect(self, host: HostAddress, wait_s: float) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        if not Path(self.known_hosts).is_file():
            raise HostKeyRejected(f"host {host.name}: known_hosts file {self.known_hosts} does not exist (set "
                                  "LUCID_KNOWN_HOSTS to the file holding the GPU hosts' keys, or pass --known-hosts)")
        client.load_host_keys(self.known_hosts)
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        try:
            client.connect(
                hostname=host.address, port=host.port, username=host.user or None,
                key_filename=host.key_path, timeout=wait_s, banner_timeout=wait_s, auth_timeout=wait_s,
                allow_agent=False, look_for_keys=host.key_path is None,
            )
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise HostKeyRejected(f"host {host.name}: host key does not match known_hosts: {exc}",
                                  reached=False) from exc
        except paramiko.SSHException as exc:
            client.close()
            if "known_hosts" in str(exc) or "not found in" in str(exc):
                raise HostKeyRejected(f"host {host.name}: {exc}", reached=False) from exc
            raise
        except ValueError as exc:  # e.g. an address no resolver takes (`gpu7..lab`): no retry helps
            client.close()
            raise HostUnreachable(f"host {host.name}: cannot connect to {host.address!r}: {exc}",
                                  reached=False) from exc
        except BaseException:
            client.close()
            raise
        transport = client.get_transport()
        if transport is not None:
            transport.set_keepalive(15)
            # paramiko's reader thread wakes every 0.1 s on an idle connection; with one kept per host
            # (hundreds) that is thousands of wake-ups a second: once a second is enough to notice a close
            transport.sock.settimeout(IDLE_CHECK_S)
        with self._lock:
            self.connects += 1
        return client

    def _client(self, host: HostAddress, deadline: float) -> paramiko.SSHClient:
        client = self._clients.get(host.name)
        transport = client.get_transport() if client is not None else None
        if client is None or transport is None or not transport.is_active():
            if client is not None:
                client.close()
            wait_s = min(self.connect_timeout_s, deadline - time.monotonic())
            if wait_s <= 0:
                raise TimeoutError("deadline reached before connecting")
            client = self._connect(host, wait_s)
            self._clients[host.name] = client
        return client

    def forget(self, name: str) -> None:
        """Close the connection to host `name` (a call on it overran its deadline); the next call reconnects.

        May run in another thread than a call stuck on that host: closing the client first stops its
        packetizer (which frees the stuck call) without sending anything; the shell is then only dropped."""
        client = self._clients.pop(name, None)
        self._shells.pop(name, None)
        if client is not None:
            client.close()

    def _drop(self, host: HostAddress) -> None:
        self.forget(host.name)

    def _host_lock(self, name: str) -> threading.Lock:
        with self._lock:
            return self._host_locks.setdefault(name, threading.Lock())

    def _run_once(self, host: HostAddress, script: str, deadline: float, sessions: list[bool]) -> ScriptResult:
        """One try; appends to `sessions` just before the script is sent (from then on it may run on the host)."""
        lock = self._host_lock(host.name)  # one call at a time on a host's kept shell, whoever calls
        if not lock.acquire(timeout=max(0.0, deadline - time.monotonic())):
            raise TimeoutError("another call on this host held its shell past this call's deadline")
        try:
            client = self._client(host, deadline)
            shell = self._shells.get(host.name)
            if shell is None or not shell.serves(client):
                timeout_s = deadline - time.monotonic()
                if timeout_s <= 0:
                    raise TimeoutError("deadline reached before the script started")
                shell = self._shells[host.name] = KeptShell(client, timeout_s)
            try:
                return shell.run(script, deadline, on_send=lambda: sessions.append(True))
            except BaseException:
                # the shell is out of step with its replies (or gone): the next call starts another one
                if self._shells.get(host.name) is shell:
                    self._shells.pop(host.name, None)
                raise
        finally:
            lock.release()

    def _connected(self, host: HostAddress) -> bool:
        client = self._clients.get(host.name)
        transport = client.get_transport() if client is not None else None
        return transport is not None and transport.is_active()

    def run_script(self, host: HostAddress, script: str, timeout_s: float) -> ScriptResult:
        """Run the script within `timeout_s` in all (connecting, retries, the script); HostUnreachable past it."""
        deadline = time.monotonic() + timeout_s
        last: BaseException | None = None
        tries = 0
        sessions: list[bool] = []  # one entry per try that had a session on the host: the script may have run
        for attempt in range(self.retries + 1):
            tries += 1
            try:
                return self._run_once(host, script, deadline, sessions)
            except HostUnreachable as exc:  # a refused key, an unusable address: reached if an earlier try was in
                exc.reached = exc.reached or bool(sessions)
                raise
            except _RETRYABLE as exc:
                last = exc
                if isinstance(exc, ShellSilent) or not (isinstance(exc, (TimeoutError, ShellClosed))
                                                        and self._connected(host)):
                    self._drop(host)  # a slow script or a lost shell on a live connection keeps it; silence not
                pause = self.backoff_s * (attempt + 1)
                if attempt == self.retries or time.monotonic() + pause >= deadline:
                    break
                time.sleep(pause)
        raise HostUnreachable(f"host {host.name} ({host.address}:{host.port}) unreachable after "
                              f"{tries} tries within {timeout_s:g} s: {type(last).__name__}: {last}",
                              reached=bool(sessions)) from last

    def close(self) -> None:
        for name in list(self._clients):
            self.forget(name)
        self._shells.clear()


def ssh_executor(known_hosts: str | None = None, *, connect_timeout_s: float = 10.0, retries: int = 2,
                 timeout_s: float = 30.0) -> HostExecutor:
    """An executor for both SSH hosts and local hosts; `timeout_s` is each call's deadline."""
    return HostExecutor({
        "ssh": SshTransport(known_hosts, connect_timeout_s=connect_timeout_s, retries=retries),
        "local": LocalTransport(),
    }, timeout_s=timeout_s)
