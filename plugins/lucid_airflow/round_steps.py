"""The runtime's scheduling round split into Airflow tasks, holding the store's round lease across them.

reconcile: repair what a crashed round left, poll the hosts. profile_bind_and_place: the policy decides
(profiling windows, sharing mode, pairs, placement) and every decision is recorded. carry_out: launch
and stop what was recorded, then give the lease back. A task that dies leaves rows the next round
finishes (the runtime's guarantee); the lease expires by itself after its TTL.

GPU hosts registered with executor `ssh` take their credentials from Airflow SSH connections named
`lucid_host_<host name>` when one exists (extras `private_key` or `key_file`, `host_key`), so keys stay in
the secrets backend; otherwise the host row's key path and LUCID_KNOWN_HOSTS apply.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

HOST_CONN_PREFIX = "lucid_host_"


def _holder() -> str:
    from airflow.sdk import get_current_context

    try:
        return f"airflow:{get_current_context()['run_id']}"
    except Exception:  # outside a task (tests calling the functions directly)
        return f"airflow:{os.getpid()}"


def _host_connection(name: str):
    from airflow.sdk import BaseHook

    try:
        return BaseHook.get_connection(HOST_CONN_PREFIX + name)
    except Exception:  # not defined: the host row's own settings apply
        return None


class ConnectionTransport:
    """SSH transport whose address, user, key and host key come from the host's Airflow connection."""

    def __init__(self, known_hosts_dir: Path, deadline_s: float = 20.0) -> None:
        from lucid_core.runtime.hosts.ssh_executor import SshTransport, default_known_hosts

        self.dir = known_hosts_dir
        self.known_hosts = known_hosts_dir / "known_hosts"
        base = Path(default_known_hosts())
        self.known_hosts.write_text(base.read_text() if base.is_file() else "", encoding="utf-8")
        self.inner = SshTransport(str(self.known_hosts), connect_timeout_s=min(10.0, deadline_s))
        self._hosts: dict[str, Any] = {}
        self._lock = threading.Lock()  # the round calls hosts from several threads at once

    def _address(self, host):
        with self._lock:
            return self._resolve(host)

    def _resolve(self, host):
        if host.name in self._hosts:
            return self._hosts[host.name]
        conn = _host_connection(host.name)
        if conn is None:
            self._hosts[host.name] = host
            return host
        from lucid_airflow.connections import ConnectionProblem, extra_fields, host_key_entry
        from lucid_core.runtime.hosts.executor import HostUnreachable

        try:
            extra = extra_fields(conn, ("key_file", "private_key", "host_key"))
            port = int(conn.port or host.port)
            if not 0 < port < 65536:
                raise ConnectionProblem(f"connection {conn.conn_id}: port {port} is not a TCP port")
            where = conn.host or host.address
            entry = host_key_entry(conn, where if port == 22 else f"[{where}]:{port}", extra["host_key"]) if (
                "host_key" in extra) else None
        except (ConnectionProblem, TypeError, ValueError) as exc:  # this host alone is unreachable, and says why
            raise HostUnreachable(f"host {host.name}: {exc}", reached=False) from None
        key_path = extra.get("key_file") or host.key_path
        if "private_key" in extra:
            key = self.dir / f"{host.name}.key"
            key.write_text(extra["private_key"].strip() + "\n", encoding="utf-8")
            key.chmod(0o600)
            key_path = str(key)
        if entry is not None:
            with self.known_hosts.open("a", encoding="utf-8") as handle:
                handle.write(entry + "\n")  # read again at each connect
        resolved = replace(host, address=conn.host or host.address, port=port, user=conn.login or host.user,
                           key_path=key_path)
        self._hosts[host.name] = resolved
        return resolved

    def run_script(self, host, script: str, timeout_s: float):
        return self.inner.run_script(self._address(host), script, timeout_s)

    def forget(self, name: str) -> None:
        self.inner.forget(name)

    def close(self) -> None:
        self.inner.close()


def host_executor(workdir: Path, deadline_s: float):
    """The executor the round and the plugin's pages reach hosts with: SSH hosts through their Airflow
    connections (key files and known_hosts kept in `workdir`), local ones by `sh`; `deadline_s` per call."""
    from lucid_core.runtime.hosts.executor import HostExecutor
    from lucid_core.runtime.hosts.local_executor import LocalTransport

    return HostExecutor({"ssh": ConnectionTransport(workdir, deadline_s), "local": LocalTransport()},
                        timeout_s=deadline_s)


def _round(url: str, workdir: Path):
    from lucid_core.config import load_live_config
    from lucid_core.runtime.round.scheduling_round import RoundSettings, SchedulingRound
    from lucid_core.runtime.store.store import Store

    config = load_live_config()
    settings = RoundSettings.from_config(config, holder=_holder())
    return SchedulingRound(Store(url), host_executor(workdir, settings.host_call_deadline_s), config, settings)


def _fenced(rnd, step: str, exc: BaseException) -> dict[str, Any]:
    """The lease was taken over while this task ran (a retried try, a round started elsewhere): stop."""
    rnd.stop_fenced(exc)
    return _summary(rnd, step, acquired=True, fenced=rnd.report.fenced)


def _summary(rnd, step: str, **extra: Any) -> dict[str, Any]:
    report = rnd.report
    return {"step": step, "holder": rnd.settings.holder, "launched": list(report.launched),
            "ended": dict(report.ended), "requeued": list(report.requeued), "unreachable": list(report.unreachable),
            "errors": list(report.errors), "conflicts": list(report.conflicts),
            "removed_hosts": list(report.removed_hosts), "pruned": list(report.pruned), **extra}


def reconcile(url: str) -> dict[str, Any]:
    """Take the lease, finish what a crashed round left pending, poll every host."""
    from lucid_core.runtime.store.lease import Fenced

    with tempfile.TemporaryDirectory(prefix="lucid-ssh-") as tmp:
        rnd = _round(url, Path(tmp))
        try:
            if not rnd.take_lease():
                return _summary(rnd, "reconcile", acquired=False)
            try:
                rnd.load_hosts()
                rnd.repair()
                rnd.observe()
            except Fenced as exc:
                return _fenced(rnd, "reconcile", exc)
            except Exception:
                rnd.give_back_lease()  # a failed step must not block the next round for the lease's TTL
                raise
            return _summary(rnd, "reconcile", acquired=True)
        finally:
            rnd.close()
            rnd.store.dispose()


def profile_bind_and_place(url: str, reconciled: dict[str, Any]) -> dict[str, Any]:
    """Let the policy decide (profiler, binder, orchestrator) and record each decision with its reason.

    The lease is taken again with a new generation, so a retried try of this task fences the one before.
    """
    from lucid_core.runtime.store.lease import Fenced

    if not reconciled.get("acquired") or reconciled.get("fenced"):
        return {"step": "decide", "acquired": False, "decisions": []}
    with tempfile.TemporaryDirectory(prefix="lucid-ssh-") as tmp:
        rnd = _round(url, Path(tmp))
        try:
            if not rnd.take_lease():
                return {"step": "decide", "acquired": False, "decisions": []}
            started = time.perf_counter()
            try:
                rnd.open_round()
                decisions = rnd.decide()
            except Fenced as exc:
                rnd.stop_fenced(exc)
                rnd.finish(started)
                return {"step": "decide", "acquired": True, "fenced": rnd.report.fenced, "decisions": []}
            except Exception:
                rnd.give_back_lease()
                raise
            rnd.finish(started)
            return {"step": "decide", "acquired": True, "decide_ms": rnd.report.decide_ms,
                    "conflicts": list(rnd.report.conflicts),
                    "decisions": [{"kind": type(d).__name__, "job": getattr(d, "job_id", None), "reason": d.reason}
                                  for d in decisions]}
        finally:
            rnd.close()
            rnd.store.dispose()


def carry_out(url: str, decided: dict[str, Any]) -> dict[str, Any]:
    """Launch and stop what was recorded; remove drained hosts that emptied; give the lease back."""
    from lucid_core.runtime.store.lease import Fenced

    if not decided.get("acquired") or decided.get("fenced"):
        return {"step": "carry_out", "acquired": False}
    with tempfile.TemporaryDirectory(prefix="lucid-ssh-") as tmp:
        rnd = _round(url, Path(tmp))
        try:
            if not rnd.take_lease():
                return {"step": "carry_out", "acquired": False}
            try:
                rnd.load_hosts()
                rnd.execute()
            except Fenced as exc:
                return _fenced(rnd, "carry_out", exc)
            return _summary(rnd, "carry_out", acquired=True, decisions=len(decided.get("decisions", [])))
        finally:
            rnd.give_back_lease()
            rnd.close()
            rnd.store.dispose()
