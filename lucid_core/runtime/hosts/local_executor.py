"""Local transport: host scripts run by a `sh` subprocess on this machine (one-machine use, tests)."""

from __future__ import annotations

import subprocess

from lucid_core.runtime.hosts.executor import HostAddress, HostExecutor, HostUnreachable, ScriptResult


class LocalTransport:
    def run_script(self, host: HostAddress, script: str, timeout_s: float) -> ScriptResult:
        try:
            done = subprocess.run(["sh", "-s"], input=script.encode("utf-8", "replace"), capture_output=True,
                                  timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired as exc:
            raise HostUnreachable(f"host {host.name}: local script timed out after {timeout_s:g} s") from exc
        # decoded as the SSH transport decodes: a job's carriage returns (progress bars) stay as it wrote them
        return ScriptResult(done.returncode, done.stdout.decode("utf-8", "replace"),
                            done.stderr.decode("utf-8", "replace"), done.stdout)

    def close(self) -> None:
        """Nothing to release."""


def local_executor(timeout_s: float = 30.0) -> HostExecutor:
    """An executor for hosts with executor='local' only."""
    return HostExecutor({"local": LocalTransport()}, timeout_s=timeout_s)
