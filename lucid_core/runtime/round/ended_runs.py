"""Round step for a run the store ended whose process still lives on its host (a hand edit, a second controller's
write): found when the host's ledger of live runs refuses a launch on its GPUs, and stopped when the live wrapper is
the one this store launched."""

from __future__ import annotations

from lucid_core.domain import RunState
from lucid_core.runtime.hosts.inventory import host_address
from lucid_core.runtime.round.base import RoundBase, _log
from lucid_core.runtime.store.schema import RunRow


class EndedRunSteps(RoundBase):
    """Stopping a run the store ended that blocks a launch."""

    def _stop_run_the_store_ended(self, host: str, holder: str) -> None:
        """A host's ledger refused a launch for a run it still sees alive, `holder`, that the store ended (a hand
        edit, a second controller's write): the store is the record, and that run's GPUs are free in every view
        built from it, so the launch would be refused round after round. When the live wrapper is the one this
        store launched (the host's pid for the run is the stored one: run ids repeat across stores, so another
        installation sharing the work directory may run one of the same name), the run is stopped and the next
        round's launch finds its GPUs free. A run the store does not know, or counts as active or lost, is left
        alone (ended is final, so a stale read cannot mistake a live run for one)."""
        if host not in self._hosts:
            return
        with self.raw_store.session() as s:
            row = s.get(RunRow, (holder, host))
            state, launched_pid = (row.state, row.pid) if row is not None else (None, None)
        if state != RunState.ENDED or launched_pid is None:
            return
        address = host_address(self._hosts[host])
        seen = self._on_host(host, lambda: self.executor.poll(address, [holder]))
        status = seen.get(holder) if seen else None
        if status is None or status.state != "RUNNING" or status.pid != launched_pid:
            self.report.errors.append(
                f"run {holder} on {host} blocks a launch and the store ended it, but the wrapper there "
                f"({status.state if status else 'no answer'}, pid {status.pid if status else '?'}) is not the one "
                f"this store launched (pid {launched_pid}): left alone")
            return
        _log.warning("round %s: run %s still runs on %s though the store ended it; stopping it",
                     self.report.round_id, holder, host)
        stopped = self._on_host(host, lambda: self.executor.stop(address, holder, "ended_in_store",
                                                                 self.settings.stop_grace_s))
        if stopped is not None:
            self.report.errors.append(f"run {holder} on {host} still ran though the store had ended it: stopped "
                                      f"({stopped.state})")
