"""Round steps that collect profiles: profiling windows that are due, the samples they left on hosts,
and the pair speeds read from the telemetry of jobs that share GPUs.
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy import select

from lucid_core.domain import RunState
from lucid_core.runtime.hosts.executor import (
    HostCommandFailed,
    HostUnreachable,
)
from lucid_core.runtime.hosts.inventory import host_address
from lucid_core.runtime.hosts.telemetry import (
    RECORD_BYTES_BOUND,
    bounded_file_bytes,
    first_window,
    parse_samples,
    summarize,
)
from lucid_core.runtime.round.base import (
    MAX_STORED_SAMPLES,
    RoundBase,
    call_value,
    pair_results,
)
from lucid_core.runtime.round.pair_speed import (
    TELEMETRY_TAIL_BYTES,
    PairSpeedSettings,
    observe_pair_speeds,
    runs_to_read,
)
from lucid_core.runtime.round.snapshot import Snapshot
from lucid_core.runtime.store.schema import (
    JobRow,
    ProfileRow,
    ProfileSampleRow,
    RunRow,
)

# most bytes of a run's telemetry file scanned for its window: a job that writes more than this into its own
# file before the window ends loses its profile (and so may not share), at a bounded cost to the round
PROFILE_SCAN_BYTES = 64 << 20


class ProfileSteps(RoundBase):
    """Profile and pair-speed collection steps of a round."""

    def collect_due_profiles(self, now: float) -> None:
        """Read the telemetry of every window that ended by `now` and has no profile yet: of running runs, and
        of runs that outlived their window but ended on its own before a round read them (settled by this round
        object, read once), from the samples they left, as the simulator profiles every job that
        outlives its window.

        Run again right before deciding, with the decision's clock, so that the policy never sees a
        window closed whose profile was not collected (also when reconcile and decide run apart).
        """
        unprofiled = (select(RunRow).join(JobRow, JobRow.job_id == RunRow.job_id)
                      .where(RunRow.node_rank == 0, RunRow.profiling_until.is_not(None), RunRow.stop_reason.is_(None),
                             JobRow.profiled.is_(False)))
        fresh = self._settled - self._ended_read  # ended by this round: its end may be dated before the round
        with self.store.session() as s:
            due = list(s.scalars(unprofiled.where(RunRow.state == RunState.RUNNING, RunRow.profiling_until <= now)))
            ended = {run for run in s.scalars(unprofiled.where(
                         RunRow.state == RunState.ENDED, RunRow.started_at.is_not(None),
                         RunRow.run_id.in_(sorted({run_id for run_id, _ in fresh})),
                         RunRow.ended_at >= RunRow.profiling_until))
                     if (run.run_id, run.host) in fresh} if fresh else set()
            self._ended_read.update((run.run_id, run.host) for run in ended)
        due = [run for run in [*due, *ended]
               if self._hosts.get(run.host) is not None and self._hosts[run.host].reachable]
        batches: dict[str, list[Callable[[], str]]] = {}
        for run in due:
            # the window sits at the file's front (a watching agent's file stays under this bound): read it
            # from there, so that what the job appends to its own run's file cannot push the samples out
            whole = max(1 << 20, bounded_file_bytes(self._kept_window_s(run), self.settings.telemetry_interval_s,
                                                    len(run.gpu_indices)))
            address = host_address(self._hosts[run.host])
            batches.setdefault(run.host, []).append(
                lambda a=address, r=run, n=whole: self.executor.read_front_lines(
                    a, r.run_id, "telemetry.jsonl", n, RECORD_BYTES_BOUND, PROFILE_SCAN_BYTES))
        for run, result in pair_results(due, self._fan_out(batches, reads=True)) if due else []:
            if isinstance(result.error, HostUnreachable):
                self._host_failed(run.host, result.error)
                continue
            if isinstance(result.error, HostCommandFailed):  # judged again next round; the others' are collected
                if run in ended:  # not read again: say so where the job's profile would have been
                    self._event_once(run.job_id, "profile_missing", f"telemetry of run {run.run_id}, which ended "
                                     f"after its window, could not be read on {run.host}: {result.error}")
                else:
                    self.report.errors.append(f"telemetry of run {run.run_id} (job {run.job_id}) on {run.host}: "
                                              f"{result.error}")
                continue
            self._collect_profile(run, call_value(result), ended=run in ended)

    def _collect_profile(self, run: RunRow, text: str, ended: bool = False) -> None:
        """Record the job's profile (once) from the window's telemetry read from the host. Of a run that
        `ended`, only when its samples show it lived through its window (`lived_through`); such a job then did
        not end in profiling (the simulator stops it at its window's end, and it ends later)."""
        with self.store.session() as s:
            job = s.get(JobRow, run.job_id)
            if job is None or job.profiled:
                return
        # an agent that also watches the job's speed samples past the window: profile the window only
        window_s = self._window_s(run)
        samples = first_window(parse_samples(text), window_s + self.settings.telemetry_margin_s)
        summary = summarize(samples)
        if ended and not lived_through(samples, window_s, self.settings.telemetry_interval_s):
            return
        with self.store.session() as s:
            job = s.get(JobRow, run.job_id)
            if summary["samples"] == 0:
                self._event(s, run.job_id, "profile_missing", f"no telemetry samples from run {run.run_id}")
                return
            job.profiled = True
            if ended:
                job.ended_in_profiling = False
            job.gpu_util, job.mem_util = summary["gpu_util"], summary["mem_util"]
            job.gpu_mem_mb, job.profile_emulated = summary["gpu_mem_mb"], summary["emulated"]
            s.add(ProfileRow(job_id=job.job_id, run_id=run.run_id, gpu_util=summary["gpu_util"],
                             mem_util=summary["mem_util"], gpu_mem_mb=summary["gpu_mem_mb"],
                             samples=summary["samples"], window_s=summary["window_s"],
                             emulated=summary["emulated"], created_at=self.clock()))
            for sample in samples[:MAX_STORED_SAMPLES]:
                s.add(ProfileSampleRow(
                    job_id=job.job_id, run_id=run.run_id, time=float(sample.get("t", 0.0)),
                    gpu_index=int(sample.get("gpu", 0)), gpu_util=float(sample.get("gpu_util", 0.0)),
                    mem_util=float(sample.get("mem_util", 0.0)), mem_used_mb=float(sample.get("mem_used_mb", 0.0)),
                    job_mem_mb=float(sample.get("job_mem_mb", 0.0)), emulated=bool(sample.get("emulated", False))))
            tag = " (emulated)" if summary["emulated"] else ""
            self._event(s, job.job_id, "profiled",
                        f"GPU util {summary['gpu_util']:.1f}%, memory util {summary['mem_util']:.1f}%, "
                        f"{summary['gpu_mem_mb']:.0f} MB over {summary['samples']} samples{tag}")

    def _observe_pairs(self, snapshot: Snapshot, now: float) -> None:
        """Read the telemetry of settled pairs and hand their observed speeds to the policy's view."""
        settings = PairSpeedSettings(self.settings.speed_settle_s, self.settings.speed_min_samples)
        wanted = [run for run in runs_to_read(snapshot, now, settings)
                  if self._hosts.get(run.host) is not None and self._hosts[run.host].reachable]
        self.keep_lease()  # reads write nothing: renew before (and after) they fan out
        batches: dict[str, list[Callable[[], str]]] = {}
        for run in wanted:
            address = host_address(self._hosts[run.host])
            batches.setdefault(run.host, []).append(
                lambda a=address, r=run: self.executor.read(a, r.run_id, "telemetry.jsonl", TELEMETRY_TAIL_BYTES))
        texts = {(run.run_id, run.host): self._answer(run.host, result)
                 for run, result in (pair_results(wanted, self._fan_out(batches, reads=True)) if wanted else [])}
        self.keep_lease()
        observed = observe_pair_speeds(snapshot, lambda run: texts.get((run.run_id, run.host)), now, settings)
        self._speeds = observed.estimates
        self.report.pair_speeds = {job_id: e.speed for job_id, e in observed.estimates.items()}
        snapshot.speed_reports = observed.reports


def lived_through(samples: list[dict], window_s: float, interval_s: float) -> bool:
    """Whether a run that ended lived through its profiling window, by its agent's samples. The agent samples
    every `interval_s` while the job lives and once more after it ended, so the last sampling time says
    nothing of its life; the one before is at most its end and, for a job that lived through, within one
    interval of the window's end. A window no longer than an interval cannot be told from a shorter life."""
    ticks = sorted({float(r["t"]) for r in samples if "t" in r})
    return window_s > interval_s and len(ticks) >= 2 and ticks[-2] - ticks[0] >= window_s - interval_s
