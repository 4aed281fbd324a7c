"""Fault injection for the reliability tests: local emulated hosts, and a round whose database restarts."""

from __future__ import annotations

from pathlib import Path

from lucid_core.runtime.hosts.inventory import HostSpec, add_host
from lucid_core.runtime.round.scheduling_round import SchedulingRound
from lucid_core.runtime.store.store import Store


def add_local_hosts(store: Store, root: Path) -> None:
    for name, pool in (("p0", "profiling"), ("m0", "main"), ("m1", "main")):
        add_host(store, HostSpec(name, executor="local", pool=pool, vc="vc-a", telemetry="emulated", gpus=2,
                                 workdir=str(root / name)))


class RestartingRound(SchedulingRound):
    """A round whose state database restarts (every connection cut) at one step."""

    def __init__(self, *args, server, restart_at: str, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.server, self.restart_at, self.restarted = server, restart_at, False

    def _restart(self) -> None:
        if not self.restarted:
            self.restarted = True
            self.server.restart()

    def _crash(self, step: str) -> None:
        if step == self.restart_at:
            self._restart()

    def _record(self, s, decision, *args):
        result = super()._record(s, decision, *args)
        if self.restart_at == "during_record":
            s.flush()  # the decision's rows are in an open transaction on a live connection ...
            self._restart()  # ... which dies under it before the commit
        return result
