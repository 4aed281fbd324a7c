"""Round step that keeps hosts' disks from filling: the files of runs over for `runtime.keep_ended_runs_days`
(logs, telemetry, the job's working directory) are removed from their hosts, a bounded batch per round."""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import select

from lucid_core.domain import RunState
from lucid_core.runtime.hosts.inventory import host_address
from lucid_core.runtime.round.base import RoundBase, update_unsynced
from lucid_core.runtime.store.schema import JobRow, RunRow


class PruneSteps(RoundBase):
    """The pruning step of a round."""

    def prune_ended_runs(self) -> None:
        """Remove from reachable hosts the files of the runs that ended more than `keep_ended_runs_s` ago (the
        oldest first, `prune_batch` of them), one call per host. The host leaves a run whose wrapper still
        lives alone (the store that says it ended is wrong): that is reported, and nothing is marked."""
        keep = self.settings.keep_ended_runs_s
        if keep is None:
            return
        with self.store.session() as s:
            rows = list(s.execute(
                select(RunRow, JobRow.user).join(JobRow, JobRow.job_id == RunRow.job_id, isouter=True)
                .where(RunRow.state == RunState.ENDED, RunRow.pruned_at.is_(None), RunRow.ended_at < self.now - keep)
                .order_by(RunRow.ended_at).limit(self.settings.prune_batch)))
        due = [(run, user) for run, user in rows
               if self._hosts.get(run.host) is not None and self._hosts[run.host].reachable]
        if not due:
            return
        by_host: dict[str, dict[str, str | None]] = {}
        for run, user in due:
            by_host.setdefault(run.host, {})[run.run_id] = user if isinstance(user, str) else None
        self.renew_lease()  # removing files is an action: a round that lost its lease removes nothing
        batches: dict[str, list[Callable[[], dict[str, str]]]] = {}
        for name, runs in by_host.items():
            address = host_address(self._hosts[name])
            batches[name] = [lambda a=address, r=runs: self.executor.prune(a, r)]
        answers: dict[str, dict[str, str]] = {}
        for name, (result,) in self._fan_out(batches).items():
            answer = self._answer(name, result)
            if answer is not None:
                answers[name] = answer
        now = self.clock()
        with self.store.session() as s:
            for run, _ in due:
                said = answers.get(run.host, {}).get(run.run_id)
                if said is None:
                    continue  # the host did not answer for it: a later round asks again
                if said == "LIVE":
                    self.report.errors.append(f"run {run.run_id} on {run.host}: the store says it ended, but its "
                                              "wrapper still runs there; its files were left alone")
                    continue
                if said == "FAILED":
                    self.report.errors.append(f"run {run.run_id} on {run.host}: some of its files could not be "
                                              "removed (left as they are; not tried again)")
                s.execute(update_unsynced(RunRow).where(RunRow.run_id == run.run_id, RunRow.host == run.host,
                                                        RunRow.pruned_at.is_(None)).values(pruned_at=now))
                self.report.pruned.append(run.run_id)
