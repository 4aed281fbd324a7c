"""SSH transport (paramiko): verified host keys, one connection per host per round, retries.

Host keys are checked against a known_hosts file and unknown hosts are refused
(paramiko's RejectPolicy). A connection is opened on first use and reused until `close()`,
which the round calls at its end. Connection failures are retried with a short backoff;
a rejected host key is never retried.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import paramiko

from lucid_core.runtime.executor import (
    HostAddress,
    HostExecutor,
    HostKeyRejected,
    HostUnreachable,
    ScriptResult,
)
from lucid_core.runtime.local_executor import LocalTransport

_RETRYABLE = (OSError, EOFError, paramiko.SSHException, socket.timeout)


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
        self.connects = 0  # connections opened (for tests of reuse)

    def _connect(self, host: HostAddress) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        if not Path(self.known_hosts).is_file():
            raise HostKeyRejected(f"host {host.name}: known_hosts file {self.known_hosts} does not exist")
        client.load_host_keys(self.known_hosts)
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        try:
            client.connect(
                hostname=host.address, port=host.port, username=host.user or None,
                key_filename=host.key_path, timeout=self.connect_timeout_s,
                banner_timeout=self.connect_timeout_s, auth_timeout=self.connect_timeout_s,
                allow_agent=False, look_for_keys=host.key_path is None,
            )
        except paramiko.BadHostKeyException as exc:
            client.close()
            raise HostKeyRejected(f"host {host.name}: host key does not match known_hosts: {exc}") from exc
        except paramiko.SSHException as exc:
            client.close()
            if "known_hosts" in str(exc) or "not found in" in str(exc):
                raise HostKeyRejected(f"host {host.name}: {exc}") from exc
            raise
        except BaseException:
            client.close()
            raise
        transport = client.get_transport()
        if transport is not None:
            transport.set_keepalive(15)
        self.connects += 1
        return client

    def _client(self, host: HostAddress) -> paramiko.SSHClient:
        client = self._clients.get(host.name)
        transport = client.get_transport() if client is not None else None
        if client is None or transport is None or not transport.is_active():
            if client is not None:
                client.close()
            client = self._connect(host)
            self._clients[host.name] = client
        return client

    def _drop(self, host: HostAddress) -> None:
        client = self._clients.pop(host.name, None)
        if client is not None:
            client.close()

    def _run_once(self, host: HostAddress, script: str, timeout_s: float) -> ScriptResult:
        client = self._client(host)
        stdin, stdout, stderr = client.exec_command("sh -s", timeout=timeout_s)
        stdin.write(script)
        stdin.flush()
        stdin.channel.shutdown_write()
        out = stdout.read().decode("utf-8", "replace")
        err = stderr.read().decode("utf-8", "replace")
        status = stdout.channel.recv_exit_status()
        return ScriptResult(status, out, err)

    def run_script(self, host: HostAddress, script: str, timeout_s: float) -> ScriptResult:
        last: BaseException | None = None
        for attempt in range(self.retries + 1):
            try:
                return self._run_once(host, script, timeout_s)
            except HostKeyRejected:
                raise
            except _RETRYABLE as exc:
                last = exc
                self._drop(host)
                if attempt < self.retries:
                    time.sleep(self.backoff_s * (attempt + 1))
        raise HostUnreachable(f"host {host.name} ({host.address}:{host.port}) unreachable after "
                              f"{self.retries + 1} tries: {type(last).__name__}: {last}") from last

    def close(self) -> None:
        for name in list(self._clients):
            self._clients.pop(name).close()


def ssh_executor(known_hosts: str | None = None, *, connect_timeout_s: float = 10.0, retries: int = 2,
                 timeout_s: float = 30.0) -> HostExecutor:
    """An executor for both SSH hosts and local hosts."""
    return HostExecutor({
        "ssh": SshTransport(known_hosts, connect_timeout_s=connect_timeout_s, retries=retries),
        "local": LocalTransport(),
    }, timeout_s=timeout_s)
