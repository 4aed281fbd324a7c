"""Round step that holds jobs to their time limits (`lucid submit --time-limit`).

A job's running time is the time its runs ran, all of them together: profiling, each run after a yield and
each run after a host fault. Once it reaches the job's limit, its runs are stopped (the stop reason
`time_limit`) and the job fails saying so when they have ended; a job between runs that has used its time
fails at once. Every write is conditional, so a cancel or a stop that came first stands; a job whose cancel is
pending is left to it.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from lucid_core.domain import TERMINAL_STATES, JobState, RunState
from lucid_core.policy.view import saved_time_limit
from lucid_core.runtime.round.base import TERMINAL_VALUES, RoundBase, update_unsynced
from lucid_core.runtime.round.run_time import time_run
from lucid_core.runtime.store.schema import JobRow, RunRow
from lucid_core.units import duration_words

TIME_LIMIT_STOP = "time_limit"  # the stop reason of a run whose job reached its time limit


def time_limit_words(limit_s: float) -> str:
    """A job's limit as its end reason and events say it."""
    return f"its time limit of {duration_words(limit_s)} (--time-limit)"


class TimeLimitSteps(RoundBase):
    """Stop the runs of jobs past their time limit; fail such a job that has no run left."""

    def hold_time_limits(self, now: float) -> None:
        active = [st.value for st in JobState if st not in TERMINAL_STATES]
        with self.store.session() as s:
            jobs = list(s.scalars(select(JobRow).where(JobRow.time_limit_s.is_not(None), JobRow.state.in_(active))))
            if not jobs:
                return
            runs: dict[str, list[RunRow]] = {job.job_id: [] for job in jobs}
            for run in s.scalars(select(RunRow).where(RunRow.job_id.in_(list(runs)))):
                runs[run.job_id].append(run)
            for job in jobs:
                if job.cancel_requested is True:
                    continue  # a cancel that came first stands: the job ends CANCELLED, not past its limit
                limit = saved_time_limit(job.time_limit_s)
                if limit is None:
                    continue  # a limit another writer broke holds nothing
                ran = time_run(runs[job.job_id], now)
                if ran >= limit:
                    self._past_time_limit(s, job, runs[job.job_id], ran, limit)

    def _past_time_limit(self, s: Any, job: JobRow, runs: list[RunRow], ran: float, limit: float) -> None:
        # a run in a state this version does not know may be running: the job is not called over while one exists
        live = [r for r in runs if r.state not in (RunState.ENDED, RunState.LOST)]
        if live:
            stopping = s.execute(update_unsynced(RunRow).where(
                RunRow.job_id == job.job_id, RunRow.state == RunState.RUNNING, RunRow.stop_reason.is_(None))
                .values(stop_reason=TIME_LIMIT_STOP)).rowcount
            if stopping:
                self._event(s, job.job_id, "stopping", f"it has run {duration_words(ran)}, past "
                            f"{time_limit_words(limit)}: stopping it, the job fails")
            return
        ended = s.execute(update_unsynced(JobRow).where(
            JobRow.job_id == job.job_id, JobRow.state.not_in(TERMINAL_VALUES)).values(
            state=JobState.FAILED.value, end_time=self.clock(), end_reason=f"it used up {time_limit_words(limit)} "
            f"in earlier runs ({duration_words(ran)})", pending_reason=None, queue_position=None)).rowcount
        if ended:
            self._event(s, job.job_id, "failed", f"past {time_limit_words(limit)} between runs")
            self.report.ended[job.job_id] = JobState.FAILED.value
