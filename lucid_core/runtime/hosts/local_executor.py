"""Local transport: host scripts run by a `sh` subprocess on this machine (one-machine use, tests)."""

from __future__ import annotations

import subprocess

from lucid_core.runtime.hosts.executor import HostAddress, HostExecutor, HostUnreachable, ScriptResult


class LocalTransport:
    def run_script(self, host: HostAddress, script: str, timeout_s: float) -> ScriptResult:
        try:
            done = subprocess.run(["sh", "-s"], input=script, capture_output=True, text=True, errors="replace",
                                  timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired as exc:
            raise HostUnreachable(f"host {host.name}: local script timed out after {timeout_s:g} s") from exc
        return ScriptResult(done.returncode, done.stdout, done.stderr)

    def close(self) -> None:
        """Nothing to release."""


def local_executor(timeout_s: float = 30.0) -> HostExecutor:
    """An executor for hosts with executor='local' only."""
    return HostExecutor({"local": LocalTransport()}, timeout_s=timeout_s)
