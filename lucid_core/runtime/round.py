"""One scheduling round: carry out what is pending -> reconcile with the hosts -> decide -> execute.

Decisions (and the runs they plan) are committed before anything is carried out. Execution
works off the store's rows, not off memory: a planned run is launched (idempotently: the
host-side run directory is the marker) and a run with a stop reason is stopped. So a round
that dies between any two steps leaves rows the next round finishes, and nothing runs twice.
A lease row keeps two rounds from deciding at once.
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from typing import Any, TypeVar

from sqlalchemy import bindparam, delete, distinct, func, select, true, update

from lucid_core.config import LucidConfig, RuntimeConfig
from lucid_core.domain import TERMINAL_STATES, GpuRef, JobState, Pool
from lucid_core.policy.decisions import (
    Decision,
    Place,
    Preempt,
    SetProfilerParams,
    SetSharingMode,
    StartProfiling,
    StopProfiling,
    Unpair,
)
from lucid_core.runtime import lease
from lucid_core.runtime.executor import (
    HostCommandFailed,
    HostExecutor,
    HostUnreachable,
    LaunchConflict,
    LaunchResult,
    LaunchSpec,
    RunAsRefused,
    RunStatus,
)
from lucid_core.runtime.host_calls import CallResult, HostCall, HostCallPool
from lucid_core.runtime.host_scripts import TelemetryLaunch
from lucid_core.runtime.inventory import ACTIVE_RUN_STATES, host_address
from lucid_core.runtime.pair_speed import (
    TELEMETRY_TAIL_BYTES,
    PairSpeedSettings,
    observe_pair_speeds,
    runs_to_read,
)
from lucid_core.runtime.pending import pending_reasons
from lucid_core.runtime.round_deadlines import lease_ttl_for
from lucid_core.runtime.schema import (
    DecisionRow,
    GpuRow,
    HostRow,
    JobEventRow,
    JobRow,
    ProfileRow,
    ProfileSampleRow,
    RoundRow,
    RunRow,
)
from lucid_core.runtime.store import Store
from lucid_core.runtime.telemetry import (
    SpeedEstimate,
    bounded_file_bytes,
    first_window,
    parse_samples,
    summarize,
)
from lucid_core.runtime.view_builder import (
    HOLD_PREFIX,
    PolicyFactory,
    Snapshot,
    build_view,
    default_policy,
    load_snapshot,
)

_log = logging.getLogger("lucid.round")
TERMINAL_VALUES = tuple(state.value for state in TERMINAL_STATES)
EmulatedProfileFn = Callable[[JobRow], tuple[float, float, float]]
MAX_STORED_SAMPLES = 2000
WATCH_S = 30 * 86400.0  # a watching agent's limit; it stops with its job long before


class InjectedCrash(BaseException):
    """Raised at a named step to simulate the round's process dying there (tests only)."""


T = TypeVar("T")


def default_holder() -> str:
    """A lease holder name: host and pid, plus a random token, because processes of look-alike containers
    share both (a holder re-takes its own unexpired lease, so two controllers' names must never collide)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class RoundSettings:
    """Knobs of the live driver; defaults and meanings are those of `LucidConfig.runtime` (config.py),
    which deployments set (file, LUCID__RUNTIME__* variables) and `from_config` reads."""

    lease_ttl_s: float = 120.0  # from_config: runtime.lease_ttl_s, or derived from the host call deadline
    stop_grace_s: float = RuntimeConfig.stop_grace_s
    launch_grace_s: float = RuntimeConfig.launch_grace_s
    telemetry_interval_s: float = RuntimeConfig.telemetry_interval_s
    telemetry_margin_s: float = 5.0
    # a main run's agent keeps sampling for the job's life, this often, to watch its speed when it shares
    monitor_interval_s: float = RuntimeConfig.monitor_interval_s
    # a pair's telemetry counts from this long after its second job started, from this many samples on
    speed_settle_s: float = RuntimeConfig.speed_settle_s
    speed_min_samples: int = RuntimeConfig.speed_min_samples
    max_launch_failures: int = RuntimeConfig.max_launch_failures  # a job whose launch hosts refuse this often fails
    host_cooldown_s: float = RuntimeConfig.host_cooldown_s  # a host that refused a launch gets no new work this long
    # give up on a host silent this long: its runs are lost, their jobs fail (or requeue_lost); None: wait
    host_lost_after_s: float | None = RuntimeConfig.host_lost_after_s or None
    requeue_lost: bool = RuntimeConfig.requeue_lost
    host_parallelism: int = RuntimeConfig.host_parallelism  # hosts called at once
    host_call_deadline_s: float = RuntimeConfig.host_call_deadline_s  # one host call's deadline (a stop: + grace)
    # workload catalog (Lucid artifact format) behind emulated telemetry; None: the synthetic one
    catalog_dir: str | None = None
    holder: str = field(default_factory=default_holder)

    @classmethod
    def from_config(cls, config: LucidConfig, **overrides: Any) -> RoundSettings:
        """Settings from the config's `runtime` section (what `lucid round` and the round DAG use)."""
        values: dict[str, Any] = {f.name: getattr(config.runtime, f.name) for f in fields(config.runtime)}
        values["host_lost_after_s"] = values["host_lost_after_s"] or None  # 0 in the config: wait forever
        values["lease_ttl_s"] = lease_ttl_for(config.runtime)  # 0 in the config: outlasts a fan-out of host calls
        return cls(**{**values, **overrides})


@dataclass
class RoundReport:
    round_id: int | None = None
    decisions: list[tuple[str, str | None, str]] = field(default_factory=list)  # (kind, job, reason)
    launched: list[str] = field(default_factory=list)  # run ids started on a host this round
    ended: dict[str, str] = field(default_factory=dict)  # job id -> terminal state
    requeued: list[str] = field(default_factory=list)
    unreachable: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    pair_speeds: dict[str, float] = field(default_factory=dict)  # job id -> speed observed while sharing
    conflicts: list[str] = field(default_factory=list)  # writes that found the row changed under them
    removed_hosts: list[str] = field(default_factory=list)  # drained hosts deleted once empty
    host_calls: int = 0  # calls made on hosts (polls, launches, stops, reads)
    decide_ms: float = 0.0
    total_ms: float = 0.0
    acquired: bool = True
    fenced: str | None = None  # why the round stopped: another took its lease over


def emulated_profile_from_catalog(catalog: Any) -> EmulatedProfileFn:
    """The catalog profile of a job's workload key, else one picked by a stable hash of its name."""
    import zlib

    workloads = catalog.workloads
    entries = list(workloads() if callable(workloads) else workloads)

    def pick(job: JobRow) -> tuple[float, float, float]:
        by_key = {w.key: w for w in entries}
        workload = by_key.get(job.workload or "")
        if workload is None:
            workload = entries[zlib.crc32(f"{job.user}/{job.name}".encode()) % len(entries)]
        return workload.gpu_util, workload.mem_util, workload.gpu_mem_mb

    return pick


class SchedulingRound:
    """Runs one round against a store and hosts. Build one per round (it holds no state between)."""

    def __init__(self, store: Store, executor: HostExecutor, config: LucidConfig,
                 settings: RoundSettings | None = None, *, policy_factory: PolicyFactory | None = None,
                 emulated_profile: EmulatedProfileFn | None = None,
                 clock: Callable[[], float] = time.time, crash_at: str | None = None,
                 close_executor: bool = True) -> None:
        self.raw_store = store
        self.store = store  # fenced on the round's lease once taken (take_lease)
        self.lease: lease.Lease | None = None
        self._renewed_at = 0.0
        self.executor = executor
        self.close_executor = close_executor  # False: a round loop keeps its host connections across rounds
        self.config = config
        self.settings = settings or RoundSettings()
        self.calls = HostCallPool(self.settings.host_parallelism, give_up=getattr(executor, "forget", None))
        self.policy_factory = policy_factory or default_policy
        self._emulated_profile = emulated_profile
        self.clock = clock
        self.crash_at = crash_at
        self.report = RoundReport()
        self._hosts: dict[str, HostRow] = {}
        self._speeds: dict[str, SpeedEstimate] = {}  # this round's pair speed estimates, per job
        self._recorded_states: dict[str, str] = {}  # job states this round's decisions just set
        self.now = clock()

    # ------------------------------------------------------------------------------ driver
    def run(self) -> RoundReport:
        started = time.perf_counter()
        self.now = self.clock()
        if not self.take_lease():
            self.report.acquired = False
            return self.report
        try:
            self.open_round()
            self._load_hosts()
            self.repair_unknown_hosts()
            self.carry_out_pending()
            self._crash("after_repair")
            self.reconcile()
            self.give_up_lost_hosts()
            self._crash("after_reconcile")
            self.decide()
            self._crash("after_record")
            self.carry_out_pending()
            self._crash("after_execute")
            self.remove_drained_hosts()
        except lease.Fenced as exc:
            self.stop_fenced(exc)
            self._finish_round(started)
            return self.report
        except Exception as exc:
            self.report.errors.append(f"{type(exc).__name__}: {exc}")
            self._finish_round(started)
            self.give_back_lease()
            raise
        finally:
            self.close()
        self._finish_round(started)
        self.give_back_lease()
        return self.report

    def close(self) -> None:
        """Release the host call pool, and the executor's connections unless a round loop keeps them."""
        self.report.host_calls = self.calls.calls
        self.calls.close()
        if self.close_executor:
            self.executor.close()

    def _fan_out(self, batches: dict[str, list[Callable[[], T]]], extra_s: float = 0.0,
                 reads: bool = False) -> dict[str, list[CallResult[T]]]:
        """Make each host's calls (in order) on all hosts at once; each call has the round's deadline (+ extra_s).
        Reads (polls, telemetry) renew the lease while in flight; actions (launches, stops) do not, so a round
        stalled in one loses its lease as before."""
        deadline = self.settings.host_call_deadline_s + extra_s
        return self.calls.run({host: [HostCall(call, deadline) for call in calls] for host, calls in batches.items()},
                              limit_s=deadline, tick=self.keep_lease if reads else None)

    def take_lease(self) -> bool:
        """Take the store's round lease with a new fencing generation; from here on every write of this
        round is conditional on it (see `lease`). False when another round or an admin command holds it."""
        taken = lease.acquire(self.raw_store, self.settings.holder, self.settings.lease_ttl_s, self.clock())
        if taken is None:
            return False
        self.lease, self._renewed_at = taken, self.clock()
        self.store = self.raw_store.fenced(taken, self.clock)
        return True

    def give_back_lease(self) -> None:
        if self.lease is not None:
            lease.release(self.raw_store, self.lease)

    def open_round(self) -> None:
        """Write this round's row in the rounds table (a fenced write: a stale take records nothing)."""
        with self.store.session() as s:
            row = RoundRow(holder=self.settings.holder, started_at=self.now,
                           generation=self.lease.generation if self.lease else None)
            s.add(row)
            s.flush()
            self.report.round_id = row.id

    def renew_lease(self) -> None:
        """Before acting on a host: make sure this round still holds the lease (and extend it); raises
        `lease.Fenced` when another took it over, so a stale round launches and stops nothing."""
        if self.lease is not None:
            lease.renew(self.raw_store, self.lease, self.clock())
            self._renewed_at = self.clock()

    def keep_lease(self) -> None:
        """Renew the lease during a long step once a quarter of its TTL has passed since the last renewal."""
        if self.lease is not None and self.clock() - self._renewed_at > self.lease.ttl_s / 4:
            self.renew_lease()

    def stop_fenced(self, exc: lease.Fenced) -> None:
        """The lease was taken over mid-round: stop here, say so (report, log, this round's own row)."""
        self.report.fenced = str(exc)
        _log.warning("round %s stopped: %s", self.report.round_id, exc)

    def _crash(self, step: str) -> None:
        if self.crash_at == step:
            raise InjectedCrash(step)

    def _finish_round(self, started: float) -> None:
        """Close this round's own row. Written unfenced: it is this round's record only (a fenced round says
        so there), and it touches nothing another round reads to decide."""
        self.report.total_ms = (time.perf_counter() - started) * 1000
        if self.report.round_id is None:
            return
        errors = self.report.errors + ([f"fenced: {self.report.fenced}"] if self.report.fenced else [])
        with self.raw_store.session() as s:
            s.execute(_update(RoundRow).where(RoundRow.id == self.report.round_id).values(
                ended_at=self.clock(), decide_ms=self.report.decide_ms, decisions=len(self.report.decisions),
                fenced=self.report.fenced is not None, error="; ".join(errors)[:2000] or None))

    def load_hosts(self) -> None:
        """Read the host inventory (the steps below need it; `run` calls it first)."""
        self._load_hosts()

    def finish(self, started: float) -> None:
        """Write the round's summary row (for drivers that run the steps one by one)."""
        self._finish_round(started)

    def _load_hosts(self) -> None:
        with self.store.session() as s:
            self._hosts = {h.name: h for h in s.scalars(select(HostRow))}

    def _event(self, s: Any, job_id: str, kind: str, message: str) -> None:
        s.add(JobEventRow(job_id=job_id, time=self.clock(), kind=kind, message=message))

    def _host_failed(self, name: str, exc: Exception) -> None:
        if name not in self.report.unreachable:
            self.report.unreachable.append(name)
        with self.store.session() as s:
            s.execute(_update(HostRow).where(HostRow.name == name).values(reachable=False, last_error=str(exc)[:1000]))

    def _cool_down(self, name: str, why: str) -> None:
        """A host that refused a launch (disk full, broken environment) gets no new work for a while."""
        until = self.clock() + self.settings.host_cooldown_s
        with self.store.session() as s:
            s.execute(_update(HostRow).where(HostRow.name == name).values(
                cooldown_until=until, last_error=f"launch refused: {why}"[:1000]))

    def _host_seen(self, name: str) -> None:
        """Mark a host that answered as reachable; last_seen is refreshed at most every 30 s per host."""
        host, now = self._hosts.get(name), self.clock()
        if (host is not None and host.reachable and host.last_error is None and host.last_seen is not None
                and now - host.last_seen < 30.0):
            return
        with self.store.session() as s:
            s.execute(_update(HostRow).where(HostRow.name == name).values(
                reachable=True, last_seen=self.clock(), last_error=None))

    # ------------------------------------------------------------------ inventory changes
    def repair_unknown_hosts(self) -> None:
        """Runs on a host the inventory no longer has (removed while a round had placed work there): a
        planned run never started, so its job waits again; a running one cannot be reached or stopped, so
        its job fails with the reason. Either way the round goes on instead of failing on the name."""
        with self.store.session() as s:
            known = select(HostRow.name)
            orphans = list(s.scalars(select(RunRow).where(RunRow.state.in_(ACTIVE_RUN_STATES),
                                                          RunRow.host.not_in(known))))
        for run in orphans:
            with self.store.session() as s:
                ended = s.execute(_update(RunRow).where(
                    RunRow.run_id == run.run_id, RunRow.host == run.host, RunRow.state == run.state).values(
                    state="ended", ended_at=self.clock(),
                    outcome=f"host {run.host} was removed from the inventory "
                            + ("before launch" if run.state == "planned" else "while it ran"))).rowcount
                job = s.get(JobRow, run.job_id)
                if not ended or job is None or JobState(job.state) in TERMINAL_STATES:
                    continue
                if run.state == "planned" and not job.cancel_requested:
                    back = JobState.SUBMITTED if run.kind == "profiling" and not job.profiled else JobState.QUEUED
                    if self._move_job(s, job, back, f"host {run.host} was removed before run {run.run_id} started"):
                        self.report.requeued.append(job.job_id)
                else:
                    self._end_job(s, job, JobState.FAILED, None,
                                  f"host {run.host} was removed from the inventory while run {run.run_id} ran "
                                  "there; its processes were not stopped by the scheduler", run)

    def remove_drained_hosts(self) -> None:
        """Delete hosts drained to be removed (`lucid hosts drain --remove`) once nothing of theirs is active."""
        with self.store.session() as s:
            waiting = list(s.scalars(select(HostRow).where(HostRow.remove_when_empty.is_(True))))
            for host in waiting:
                busy = s.scalar(select(RunRow.run_id).where(
                    RunRow.host == host.name, RunRow.state.in_((*ACTIVE_RUN_STATES, "lost"))).limit(1))
                if busy is not None:
                    continue
                s.execute(delete(GpuRow).where(GpuRow.host == host.name))
                s.execute(delete(HostRow).where(HostRow.name == host.name))
                self.report.removed_hosts.append(host.name)
                _log.info("host %s drained and removed", host.name)

    # ------------------------------------------------------------------ carry out pending rows
    def carry_out_pending(self) -> None:
        """Launch planned runs and stop runs that have a stop reason; mark decisions done."""
        with self.store.session() as s:
            planned = list(s.scalars(select(RunRow).where(RunRow.state == "planned")
                                     .order_by(RunRow.planned_at, RunRow.node_rank)))
            stopping = list(s.scalars(select(RunRow).where(RunRow.state == "running",
                                                           RunRow.stop_reason.is_not(None))))
        down = self._stop_runs(stopping, "stop")
        still_stopping = {r.job_id for r in stopping if r.host in down}
        # first nodes first: a run whose first node is refused never starts its others (wide jobs only)
        for wave in ([r for r in planned if r.node_rank == 0], [r for r in planned if r.node_rank != 0]):
            launches: list[RunRow] = []
            batches: dict[str, list[Callable[[], LaunchResult]]] = {}
            for run in wave:
                if run.host in down or run.job_id in still_stopping:
                    continue  # never start a job again while its previous run may still be alive
                with self.store.session() as s:
                    job = s.get(JobRow, run.job_id)
                    still_planned = s.scalar(select(RunRow.state).where(
                        RunRow.run_id == run.run_id, RunRow.host == run.host)) == "planned"
                if not still_planned:
                    continue  # another node's launch failed this round and ended this one: nothing of it may start
                if job is None or JobState(job.state) in TERMINAL_STATES or job.cancel_requested:
                    self._abandon_planned(run)
                    continue
                address, spec = host_address(self._hosts[run.host]), self._launch_spec(run, job)
                launches.append(run)
                batches.setdefault(run.host, []).append(lambda a=address, sp=spec: self.executor.launch(a, sp))
            if not launches:
                continue
            self.renew_lease()  # a round that lost its lease launches nothing
            results = _in_order(launches, self._fan_out(batches))
            self._crash("after_launch")  # the hosts run them, the store does not know yet
            # record what started before handling refusals: a refusal ends the other nodes of its run
            try:
                for run, outcome in [*[r for r in results if r[1].ok], *[r for r in results if not r[1].ok]]:
                    self._apply_launch(run, outcome, down)
            except lease.Fenced:  # lost the lease between renewing it and the launches reaching their hosts
                for run, outcome in results:
                    if outcome.ok and outcome.value is not None and not outcome.value.already_launched:
                        self._undo_stale_launch(run)
                raise
        self._close_decisions()

    def _undo_stale_launch(self, run: RunRow) -> None:
        """This round lost its lease between renewing it and its launch reaching the host: when the new holder
        no longer expects the run (it ended it before launch), stop it, so no run lives that the store does not
        know; a run still planned is the new holder's to launch (the host answers already_launched)."""
        with self.raw_store.session() as s:
            state = s.scalar(select(RunRow.state).where(RunRow.run_id == run.run_id, RunRow.host == run.host))
        if state in ("planned", "running"):
            return
        _log.warning("round %s: run %s reached %s after the lease was lost (store: %s); stopping it",
                     self.report.round_id, run.run_id, run.host, state or "no row")
        self._on_host(run.host, lambda: self.executor.stop(host_address(self._hosts[run.host]), run.run_id,
                                                           "fenced", self.settings.stop_grace_s))

    def _apply_launch(self, run: RunRow, outcome: CallResult[LaunchResult], down: set[str]) -> None:
        """Record one launch's outcome in the store: started, host down (the run stays planned), or refused."""
        error = outcome.error
        if isinstance(error, HostUnreachable):
            down.add(run.host)
            self._host_failed(run.host, error)
            return
        if isinstance(error, LaunchConflict):  # the host's ledger says the store was behind: requeue, no cool-down
            self.report.errors.append(f"launch {run.run_id} on {run.host}: {error}")
            self._launch_failed(run, str(error), conflict=True)
            down.update(self._stop_started_peers(run.run_id))
            return
        if isinstance(error, RunAsRefused):  # the job's user cannot run there: no retry, the host stays in use
            self.report.errors.append(f"launch {run.run_id} on {run.host}: {error}")
            self._launch_failed(run, str(error), final=True)
            down.update(self._stop_started_peers(run.run_id))
            return
        if error is not None:
            self.report.errors.append(f"launch {run.run_id} on {run.host}: {error}")
            self._cool_down(run.host, str(error))
            self._launch_failed(run, str(error))
            down.update(self._stop_started_peers(run.run_id))
            return
        result = outcome.value
        assert result is not None
        now = self.clock()
        values: dict[str, Any] = {"state": "running", "pid": result.pid, "started_at": now}
        if run.profiling_until is not None and not result.already_launched:
            # the window is the job's: it counts from the launch, not from when it was planned
            values["profiling_until"] = now + (run.profiling_until - run.planned_at)
        with self.store.session() as s:
            s.execute(_update(RunRow).where(RunRow.run_id == run.run_id, RunRow.host == run.host).values(**values))
            row = s.get(JobRow, run.job_id)
            if row is not None and run.node_rank == 0:
                row.start_time = now  # start of the job's current run
            self._event(s, run.job_id, "launched", f"{run.kind} run {run.run_id} on {run.host} "
                        f"GPUs {run.gpu_indices} pid {result.pid}"
                        + (" (already running: relaunch skipped)" if result.already_launched else ""))
        if not result.already_launched:
            self.report.launched.append(run.run_id)

    def _close_decisions(self) -> None:
        with self.store.session() as s:
            open_ids = set(s.scalars(select(RunRow.decision_id).where(
                RunRow.decision_id.is_not(None), RunRow.state == "planned")))
            for decision in s.scalars(select(DecisionRow).where(DecisionRow.status == "pending")):
                if decision.id not in open_ids and decision.kind in {"StartProfiling", "Place"}:
                    decision.status, decision.executed_at = "done", self.clock()
                elif decision.kind in {"StopProfiling", "Preempt"}:
                    busy = s.scalar(select(RunRow.run_id).where(
                        RunRow.job_id == decision.job_id, RunRow.state == "running",
                        RunRow.stop_reason.is_not(None)).limit(1))
                    if busy is None:
                        decision.status, decision.executed_at = "done", self.clock()

    def _launch_spec(self, run: RunRow, job: JobRow) -> LaunchSpec:
        host = self._hosts[run.host]
        with self.store.session() as s:
            peers = list(s.scalars(select(RunRow).where(RunRow.run_id == run.run_id).order_by(RunRow.node_rank)))
        master = self._hosts[peers[0].host].address if peers else host.address
        env = dict(job.env or {})
        env.update({
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in run.gpu_indices),
            "LUCID_JOB_ID": job.job_id, "LUCID_RUN_ID": run.run_id,
            "LUCID_NODE_RANK": str(run.node_rank), "LUCID_NUM_NODES": str(max(1, len(peers))),
            "LUCID_MASTER_ADDR": master, "LUCID_NUM_GPUS": str(job.gpus),
        })
        telemetry = None
        windowed = run.profiling_until is not None
        # main runs that may share are watched for their whole life: their speed beside a partner
        watched = run.pool == Pool.MAIN.value and not job.no_share and (job.profiled or windowed)
        if (windowed or watched) and run.node_rank == 0:
            source, digest = _agent_source()
            emulated = None
            if host.telemetry == "emulated":
                emulated = self._emulated(job)
            telemetry = TelemetryLaunch(
                agent_source=source, agent_name=f"lucid_telemetry_{digest}.py", python=host.python,
                gpu_indices=tuple(run.gpu_indices),
                interval_s=self.settings.telemetry_interval_s if windowed else self.settings.monitor_interval_s,
                duration_s=WATCH_S if watched else self._window_s(run) + self.settings.telemetry_margin_s,
                emulated=emulated, seed=job.seq,
                # a watching agent bounds its file: the profiling window whole, then speed samples only
                keep_all_s=(self._kept_window_s(run) if windowed else 0.0) if watched else None,
                # profiled in place and watched: dense samples for the window, the watch's rate after it
                watch_interval_s=self.settings.monitor_interval_s if windowed and watched else None)
        return LaunchSpec(run.run_id, job.command, env, telemetry, user=job.user, job_id=job.job_id,
                          gpu_indices=tuple(run.gpu_indices), partner=run.partner)

    @staticmethod
    def _window_s(run: RunRow) -> float:
        """Length of a run's profiling window (its end is rebased to the launch once launched)."""
        begin = run.started_at if run.started_at is not None else run.planned_at
        return max(1.0, (run.profiling_until or begin) - begin)

    def _kept_window_s(self, run: RunRow) -> float:
        """How long from its start a watching agent keeps every sample: the profile's window, a sample over."""
        return self._window_s(run) + self.settings.telemetry_margin_s + self.settings.telemetry_interval_s

    def _emulated(self, job: JobRow) -> tuple[float, float, float]:
        if self._emulated_profile is None:
            from lucid_core.sim.catalog import WorkloadCatalog

            catalog = (WorkloadCatalog.from_artifact(self.settings.catalog_dir) if self.settings.catalog_dir
                       else WorkloadCatalog.synthetic())
            self._emulated_profile = emulated_profile_from_catalog(catalog)
        return self._emulated_profile(job)

    def _abandon_planned(self, run: RunRow) -> None:
        """End a planned run of a job that ended or was cancelled. A round that died between a launch and
        its record may have started it: stop it on its host first (MISSING when it never started); a host
        that does not answer keeps the run planned for a later round."""
        host = self._hosts.get(run.host)
        if host is not None:
            self.renew_lease()
            status = self._on_host(run.host, lambda: self.executor.stop(host_address(host), run.run_id, "cancel",
                                                                        self.settings.stop_grace_s))
            if status is None:
                return
            if status.state != "MISSING":
                self._abandon(run, f"stopped ({status.state}): its job was cancelled after a round that died "
                                   "had launched it")
                return
        self._abandon(run, "job cancelled before launch")

    def _abandon(self, run: RunRow, why: str) -> None:
        with self.store.session() as s:
            s.execute(_update(RunRow).where(RunRow.run_id == run.run_id, RunRow.host == run.host).values(
                state="ended", ended_at=self.clock(), outcome=why))

    def _launch_failed(self, run: RunRow, why: str, final: bool = False, conflict: bool = False) -> None:
        """The host refused the launch: end the run and put the job back where it waits (or fail it when
        `final`: trying again cannot help). A `conflict` (the host's ledger of live runs refused it) ends
        the run with outcome 'conflict: ...' and never counts as one of the job's launch failures.

        Other nodes of a wide job that did start are only marked for a stop (`peer_ended`): they count as
        ended once the stop has reached their host, so a requeued job never runs beside its old copy.
        """
        with self.store.session() as s:
            for peer in s.scalars(select(RunRow).where(RunRow.run_id == run.run_id)):
                if peer.state == "running" and peer.host != run.host:
                    peer.stop_reason = peer.stop_reason or "peer_ended"
                elif peer.state in ("planned", "running"):
                    peer.state, peer.ended_at = "ended", self.clock()
                    peer.outcome = f"{'conflict' if conflict else 'launch failed'}: {why}"[:1000]
            s.flush()
            failures = s.scalar(select(func.count(distinct(RunRow.run_id))).where(  # tries, not nodes
                RunRow.job_id == run.job_id, RunRow.outcome.like("launch failed%"))) or 0
            job = s.get(JobRow, run.job_id)
            if job is None or JobState(job.state) in TERMINAL_STATES:
                return
            self._event(s, job.job_id, "launch_conflict" if conflict else "launch_failed", why[:1000])
            if conflict:
                failures = 0
                other = s.scalar(select(RunRow.run_id).where(RunRow.job_id == run.job_id, RunRow.run_id != run.run_id,
                                                             RunRow.state.in_(("planned", "running"))).limit(1))
                if other is not None:
                    return  # the job runs (or is about to) as another run: that one decides its fate
            if final:
                self._end_job(s, job, JobState.FAILED, None, why[:1000], run)
                return
            if failures >= self.settings.max_launch_failures:
                self._end_job(s, job, JobState.FAILED, None,
                              f"could not be launched ({failures} tries); last error: {why[:500]}", run)
                return
            back = JobState.SUBMITTED if run.kind == "profiling" and not job.profiled else JobState.QUEUED
            if not self._move_job(s, job, back):
                return
        self.report.requeued.append(run.job_id)

    def _stop_started_peers(self, run_id: str) -> set[str]:
        """Stop now (TERM, grace, KILL) the nodes of `run_id` that a failed launch marked `peer_ended`; returns
        the hosts that did not answer (their nodes stay running with the stop reason: later rounds retry)."""
        with self.store.session() as s:
            peers = list(s.scalars(select(RunRow).where(RunRow.run_id == run_id, RunRow.state == "running",
                                                        RunRow.stop_reason.is_not(None))))
        return self._stop_runs(peers, "peer_ended")

    def _stop_runs(self, runs: list[RunRow], default_reason: str) -> set[str]:
        """Stop each run on its host (TERM, grace, KILL) and settle it; returns the hosts that did not
        answer, whose runs stay `running` with their stop reason for a later round to retry."""
        down: set[str] = set()
        if not runs:
            return down
        self.renew_lease()
        grace = self.settings.stop_grace_s
        batches: dict[str, list[Callable[[], RunStatus]]] = {}
        for run in runs:
            address = host_address(self._hosts[run.host])
            batches.setdefault(run.host, []).append(
                lambda a=address, r=run: self.executor.stop(a, r.run_id, r.stop_reason or default_reason, grace))
        results = _in_order(runs, self._fan_out(batches, extra_s=grace))
        for run, result in results:
            if run.host in down:
                continue
            if isinstance(result.error, HostUnreachable):
                down.add(run.host)
                self._host_failed(run.host, result.error)
                continue
            if isinstance(result.error, HostCommandFailed):  # this run's stop answered garbage: retried next round
                self.report.errors.append(f"stop of run {run.run_id} (job {run.job_id}) on {run.host}: {result.error}")
                continue
            status = _value(result)
            if status.state == "UNREADABLE":
                self._unreadable(run, status)
                continue
            self._note_tampering(run, status)
            self._settle(run, status)
        return down

    # ---------------------------------------------------------------------------- reconcile
    def reconcile(self) -> None:
        """Poll every host with active runs; end what ended; collect telemetry; honour cancels."""
        now = self.now
        with self.store.session() as s:
            runs = list(s.scalars(select(RunRow).where(RunRow.state == "running")))
        by_host: dict[str, list[RunRow]] = {}
        for run in runs:
            by_host.setdefault(run.host, []).append(run)
        self.keep_lease()  # polls read only: renew first when a quarter of the TTL has passed
        polls = self._fan_out({name: [self._poll_call(host, by_host.get(name, []))]
                               for name, host in self._hosts.items() if by_host.get(name) or not host.reachable},
                              reads=True)
        seen: list[tuple[RunRow, RunStatus]] = []
        for name, (result,) in polls.items():
            if isinstance(result.error, HostUnreachable):
                self._host_failed(name, result.error)
                continue
            if isinstance(result.error, HostCommandFailed):  # garbled answer: judge this host's runs next round
                self.report.errors.append(str(result.error))
                continue
            statuses = _value(result)
            self._host_seen(name)
            seen.extend((run, statuses[run.run_id]) for run in by_host.get(name, []) if run.run_id in statuses)
        swept = self._sweep_leftovers([run for run, status in seen
                                       if status.state == "EXITED" and run.stop_reason is None])
        for run, status in seen:
            self._judge(run, status, now, swept.get((run.run_id, run.host)))
        self._cancel_requested()
        self.collect_due_profiles(now)

    def _judge(self, run: RunRow, status: RunStatus, now: float, sweep: RunStatus | None) -> None:
        """Act on one run's polled status (`sweep`: the leftover sweep of a run that ended on its own). Its
        records are the host's and, on account hosts, within reach of jobs: whatever they hold, only this run
        is affected, never the round."""
        if status.state == "UNREADABLE":
            self._unreadable(run, status)
            return
        self._note_tampering(run, status)
        if status.state == "RUNNING":
            return  # profiles of windows that ended are collected after reconcile
        if status.state == "NOPID":
            if now - run.planned_at > self.settings.launch_grace_s:
                self._launch_failed(run, "wrapper never started on the host")
            return
        if status.state == "EXITED" and run.stop_reason is None and sweep is not None and sweep.state == "EXITED":
            status = replace(status, escaped=sweep.escaped)
        self._settle(run, status)

    def _unreadable(self, run: RunRow, status: RunStatus) -> None:
        """A run whose status line the host garbled: named in the report and the job's events (once), and
        judged again next round; a cancel still reaches it through the stop, which needs no status."""
        why = f"run {run.run_id} on host {run.host}: unreadable status {status.detail!r}"
        self.report.errors.append(f"job {run.job_id}: {why}")
        self._event_once(run.job_id, "run_unreadable", why)

    def _note_tampering(self, run: RunRow, status: RunStatus) -> None:
        """Record (once per run and record) that a run's pid or exit-code file failed its check on the host:
        the host judged the run by what the kernel says instead, so nothing else follows from it."""
        if not status.tampered:
            return
        what = " and ".join({"pid": "its pid file named another process",
                             "exit_code": "its exit-code file was not written by its wrapper",
                             "records": "its control directory was removed while it ran"}[t]
                            for t in status.tampered)
        self._event_once(run.job_id, "records_tampered",
                         f"run {run.run_id} on host {run.host}: {what}; the file was not believed")

    def _event_once(self, job_id: str, kind: str, message: str) -> None:
        """An event for the job unless the same one is already recorded (a round repeats what it sees)."""
        with self.store.session() as s:
            seen = s.scalar(select(JobEventRow.id).where(JobEventRow.job_id == job_id, JobEventRow.kind == kind,
                                                         JobEventRow.message == message[:1000]).limit(1))
            if seen is None:
                self._event(s, job_id, kind, message[:1000])

    def _poll_call(self, host: HostRow, runs: list[RunRow]) -> Callable[[], dict[str, RunStatus]]:
        """The reconcile call for one host: poll its running runs, or probe it when idle and unreachable."""
        address, run_ids = host_address(host), [r.run_id for r in runs]
        if run_ids:
            return lambda: self.executor.poll(address, run_ids)

        def probe() -> dict[str, RunStatus]:  # idle and unreachable last time: does it answer now?
            self.executor.probe(address)
            return {}

        return probe

    def _sweep_leftovers(self, runs: list[RunRow]) -> dict[tuple[str, str], RunStatus]:
        """A run that ended on its own may leave processes behind (a daemon it started, workers that
        left its group) holding GPU memory the next job needs: the stop script, run on an ended run,
        kills only what still carries the run's marker. Returns the sweeps that answered, per (run, host);
        for the others the poll's status stands."""
        if not runs:
            return {}
        self.renew_lease()
        grace = self.settings.stop_grace_s
        batches: dict[str, list[Callable[[], RunStatus]]] = {}
        for run in runs:
            address = host_address(self._hosts[run.host])
            batches.setdefault(run.host, []).append(lambda a=address, r=run: self.executor.stop(a, r.run_id, "ended",
                                                                                               grace))
        swept = {}
        for run, result in _in_order(runs, self._fan_out(batches, extra_s=grace)):
            value = self._answer(run.host, result)
            if value is not None:
                swept[(run.run_id, run.host)] = value
        return swept

    def _on_host(self, name: str, call: Callable[[], T]) -> T | None:
        """`call()` against host `name` now, in the round's thread (a single call, outside a fan-out); None when
        the host did not answer (marked failed) or answered garbage (reported)."""
        try:
            return call()
        except HostUnreachable as exc:
            self._host_failed(name, exc)
        except HostCommandFailed as exc:
            self.report.errors.append(str(exc))
        return None

    def _answer(self, name: str, result: CallResult[T]) -> T | None:
        """A call's value; None when the host did not answer (marked failed) or answered garbage (reported;
        its runs are judged again next round)."""
        if isinstance(result.error, HostUnreachable):
            self._host_failed(name, result.error)
            return None
        if isinstance(result.error, HostCommandFailed):
            self.report.errors.append(str(result.error))
            return None
        return _value(result)

    def give_up_lost_hosts(self) -> None:
        """With `host_lost_after_s` set: end the runs of hosts silent that long (fail or requeue their jobs),
        and stop what is left of such runs on hosts that answer again before new work lands there."""
        from lucid_core.runtime.host_loss import LOST_RUN_STATE, mark_lost, reap_lost

        if self.settings.host_lost_after_s is None:
            return
        loss = mark_lost(self.store, self.now, self.settings.host_lost_after_s, requeue=self.settings.requeue_lost)
        for job_id in loss.failed:
            self.report.ended[job_id] = JobState.FAILED.value
        self.report.requeued.extend(loss.requeued)
        with self.store.session() as s:
            back = s.scalar(select(RunRow.run_id).join(HostRow, HostRow.name == RunRow.host).where(
                RunRow.state == LOST_RUN_STATE, HostRow.reachable.is_(True)).limit(1))
        if back is not None:
            reap_lost(self.store, self.executor, self.now, grace_s=self.settings.stop_grace_s)

    def collect_due_profiles(self, now: float) -> None:
        """Read telemetry of every running window that ended by `now` and has no profile yet.

        Run again right before deciding, with the decision's clock, so that the policy never sees a
        window closed whose profile was not collected (also when reconcile and decide run apart).
        """
        with self.store.session() as s:
            due = list(s.scalars(
                select(RunRow).join(JobRow, JobRow.job_id == RunRow.job_id)
                .where(RunRow.state == "running", RunRow.node_rank == 0, RunRow.profiling_until.is_not(None),
                       RunRow.profiling_until <= now, RunRow.stop_reason.is_(None), JobRow.profiled.is_(False))))
        due = [run for run in due if self._hosts.get(run.host) is not None and self._hosts[run.host].reachable]
        batches: dict[str, list[Callable[[], str]]] = {}
        for run in due:
            # the whole file: a watching agent's stays under this bound, its window at the front
            whole = max(1 << 20, bounded_file_bytes(self._kept_window_s(run), self.settings.telemetry_interval_s,
                                                    len(run.gpu_indices)))
            address = host_address(self._hosts[run.host])
            batches.setdefault(run.host, []).append(
                lambda a=address, r=run, n=whole: self.executor.read(a, r.run_id, "telemetry.jsonl", n))
        for run, result in _in_order(due, self._fan_out(batches, reads=True)) if due else []:
            if isinstance(result.error, HostUnreachable):
                self._host_failed(run.host, result.error)
                continue
            if isinstance(result.error, HostCommandFailed):  # judged again next round; the others' are collected
                self.report.errors.append(f"telemetry of run {run.run_id} (job {run.job_id}) on {run.host}: "
                                          f"{result.error}")
                continue
            self._collect_profile(run, _value(result))

    def _collect_profile(self, run: RunRow, text: str) -> None:
        """Record the job's profile (once) from the window's telemetry read from the host."""
        with self.store.session() as s:
            job = s.get(JobRow, run.job_id)
            if job is None or job.profiled:
                return
        # an agent that also watches the job's speed samples past the window: profile the window only
        samples = first_window(parse_samples(text), self._window_s(run) + self.settings.telemetry_margin_s)
        summary = summarize(samples)
        with self.store.session() as s:
            job = s.get(JobRow, run.job_id)
            if summary["samples"] == 0:
                self._event(s, run.job_id, "profile_missing", f"no telemetry samples from run {run.run_id}")
                return
            job.profiled = True
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

    def _settle(self, run: RunRow, status: RunStatus) -> None:
        """A run ended (on its own or stopped): record it and decide the job's fate."""
        if status.state not in {"EXITED", "VANISHED", "MISSING"}:
            return
        now = self.clock()
        stopped = status.stop_requested and run.stop_reason is not None
        if status.state == "MISSING":
            outcome = "run directory vanished from the host"
        elif status.state == "VANISHED":
            outcome = "stopped" if stopped else "process vanished without an exit code"
            if "exit_code" in status.tampered and not stopped:
                outcome += " (an exit-code file it left was not written by its wrapper and was not believed)"
        else:
            outcome = "stopped" if stopped else f"exited with code {status.exit_code}"
            if status.disk_full and not stopped:
                outcome += f"; the disk of host {run.host} was full when it ended: its log may be cut short"
        if status.escaped and run.stop_reason is None:
            outcome += (f"; {status.escaped} of its processes outlived it (they had left its process group) "
                        "and were killed")
        elif status.escaped:
            outcome += f"; the stop also killed {status.escaped} of its processes that had left its process group"
        with self.store.session() as s:
            row = s.get(RunRow, (run.run_id, run.host))
            if row is None or row.state == "ended":
                return
            row.state, row.ended_at, row.exit_code, row.outcome = "ended", now, status.exit_code, outcome
            s.flush()
            still = s.scalar(select(RunRow.host).where(RunRow.run_id == run.run_id,
                                                       RunRow.state.in_(("planned", "running"))).limit(1))
            job = s.get(JobRow, run.job_id)
            if job is None or JobState(job.state) in TERMINAL_STATES:
                return
            if still is not None and not stopped:
                # a wide job: other nodes still run. Success waits for them; a failure fails the
                # job now and takes the other nodes down with it.
                if status.state == "EXITED" and status.exit_code == 0:
                    return
                s.execute(_update(RunRow).where(RunRow.run_id == run.run_id, RunRow.state == "running")
                          .values(stop_reason="peer_ended"))
                self._end_job(s, job, JobState.FAILED, status.exit_code,
                              f"node {run.host} (rank {run.node_rank}): {outcome}", run)
                return
            if stopped or run.stop_reason == "peer_ended":
                reason = run.stop_reason
                if reason == "cancel":
                    self._end_job(s, job, JobState.CANCELLED, None, "cancelled by request", run)
                elif reason == "peer_ended":
                    return  # the peer that ended first decided the job's fate
                else:
                    self._event(s, job.job_id, "stopped", f"{run.kind} run {run.run_id} stopped ({reason})")
                return
            if status.state == "EXITED" and status.exit_code == 0:
                self._end_job(s, job, JobState.COMPLETED, 0, outcome, run)
            else:
                self._end_job(s, job, JobState.FAILED, status.exit_code, outcome, run)

    def _end_job(self, s: Any, job: JobRow, state: JobState, exit_code: int | None, why: str, run: RunRow) -> bool:
        """Move a job to a terminal state once (compare-and-set: only from a state that is not terminal);
        False, with a logged conflict, when another writer ended it first."""
        now = self.clock()
        ran = run.started_at is not None
        in_window = ran and (run.kind == "profiling" or (run.profiling_until is not None
                                                           and now <= run.profiling_until + 1))
        in_profiling = in_window and state is not JobState.CANCELLED
        ended = s.execute(_update(JobRow).where(JobRow.job_id == job.job_id, JobRow.state.not_in(TERMINAL_VALUES))
                          .values(state=state.value, end_time=now, exit_code=exit_code, end_reason=why,
                                  ended_in_profiling=in_profiling, pending_reason=None, queue_position=None)).rowcount
        if not ended:
            self._conflict(job.job_id, f"ending it as {state.value}: it had already ended")
            return False
        s.expire(job)
        where = " inside its profiling window" if in_profiling else ""
        self._event(s, job.job_id, state.value.lower(), f"{why}{where}")
        self.report.ended[job.job_id] = state.value
        return True

    def _move_job(self, s: Any, job: JobRow, state: JobState, why: str | None = None,
                  expect: tuple[str, ...] | None = None) -> bool:
        """Compare-and-set a job's state: from `expect` (default: any state that is not terminal) to `state`."""
        allowed = JobRow.state.in_(expect) if expect is not None else JobRow.state.not_in(TERMINAL_VALUES)
        moved = s.execute(_update(JobRow).where(JobRow.job_id == job.job_id, allowed)
                          .values(state=state.value)).rowcount
        if not moved:
            self._conflict(job.job_id, f"moving it to {state.value}: its state changed meanwhile")
            return False
        s.expire(job)
        if why:
            self._event(s, job.job_id, state.value.lower(), why)
        return True

    def _conflict(self, job_id: str, what: str) -> None:
        """Another writer changed the row first: back off, say so, change nothing (no host is blamed)."""
        message = f"job {job_id}: conflict {what}"
        self.report.conflicts.append(message)
        _log.info("round %s: %s", self.report.round_id, message)

    def _cancel_requested(self) -> None:
        active = [st.value for st in JobState if st not in TERMINAL_STATES]
        with self.store.session() as s:
            jobs = list(s.scalars(select(JobRow).where(JobRow.cancel_requested.is_(True), JobRow.state.in_(active))))
            for job in jobs:
                runs = list(s.scalars(select(RunRow).where(RunRow.job_id == job.job_id,
                                                           RunRow.state.in_(("planned", "running")))))
                for run in runs:
                    if run.state == "planned":
                        run.state, run.ended_at, run.outcome = "ended", self.clock(), "cancelled before launch"
                    else:
                        run.stop_reason = "cancel"
                if not any(r.state == "running" for r in runs):
                    ended = s.execute(_update(JobRow).where(
                        JobRow.job_id == job.job_id, JobRow.state.not_in(TERMINAL_VALUES)).values(
                        state=JobState.CANCELLED.value, end_time=self.clock(), end_reason="cancelled",
                        pending_reason=None, queue_position=None)).rowcount
                    if not ended:
                        self._conflict(job.job_id, "cancelling it: it had already ended")
                        continue
                    self._event(s, job.job_id, "cancelled", "cancelled before it ran")
                    self.report.ended[job.job_id] = JobState.CANCELLED.value
        self.carry_out_pending_stops()

    def carry_out_pending_stops(self) -> None:
        with self.store.session() as s:
            stopping = list(s.scalars(select(RunRow).where(RunRow.state == "running",
                                                           RunRow.stop_reason.is_not(None))))
        self._stop_runs(stopping, "stop")

    # ------------------------------------------------------------------------------- decide
    def decide(self) -> list[Decision]:
        """Build the view, let the policy decide, and commit decisions + planned runs + job fields.

        The view's clock is the round's start, the same instant reconcile judged profiling windows by,
        so every window the policy sees expired has had its telemetry collected.
        """
        now = self.now
        if not self._hosts:
            self._load_hosts()
        self.collect_due_profiles(now)
        snapshot = load_snapshot(self.store, now)
        self._observe_pairs(snapshot, now)
        t0 = time.perf_counter()
        built = build_view(snapshot, self.config, now, self.policy_factory)
        decisions = built.policy.schedule(built.view)
        self.report.decide_ms = (time.perf_counter() - t0) * 1000
        view = built.view
        sharing_reason = snapshot.state.get("sharing_reason")
        for decision in decisions:
            if isinstance(decision, SetSharingMode):
                sharing_reason = decision.reason
        reasons = pending_reasons(view, built.policy, sharing_reason)
        self._crash("after_snapshot")  # decided from the snapshot, nothing written yet
        with self.store.session() as s:
            for decision in decisions:
                self._record(s, decision, view, now, snapshot)
            for job_id, estimate in self._speeds.items():  # kept: eta, explain and the pages use what was measured
                s.execute(_update(RunRow).where(RunRow.job_id == job_id, RunRow.kind == "main",
                                                RunRow.state == "running")
                          .values(observed_speed=estimate.speed, observed_speed_at=now,
                                  observed_speed_samples=estimate.samples, observed_speed_emulated=estimate.emulated))
            windowed = {r.job_id for r in snapshot.runs if r.profiling_until is not None}
            changes = []
            for job_id, job in view.jobs.items():
                old = snapshot.jobs.get(job_id)
                if old is None or job_id in built.frozen:
                    continue  # placeholders, and jobs whose stop is still pending
                position, reason = reasons.get(job_id, (None, None))
                new = {"predicted_duration": job.predicted_duration,
                       "share_class": int(job.share_class) if job.share_class is not None else None,
                       "known_min_duration": job.known_min_duration, "no_share": job.no_share,
                       "yields": job.yields,
                       "queue_position": position, "pending_reason": reason}
                if job.state in (JobState.SUBMITTED, JobState.QUEUED):
                    new["state"] = job.state.value
                if any(getattr(old, k) != v for k, v in new.items()):
                    changes.append({"job_id": job_id, **new})
                alloc = view.allocations.get(job_id)
                if alloc is not None and alloc.profiling_until is None and job_id in windowed:
                    s.execute(_update(RunRow).where(RunRow.job_id == job_id, RunRow.state.in_(("planned", "running")),
                                                    RunRow.profiling_until.is_not(None)).values(profiling_until=None))
            self._record_predictions(s, built.policy, view, decisions, now)
            s.flush()
            moves = [c for c in changes if "state" in c]
            for key_set in {tuple(sorted(c)) for c in changes if "state" not in c}:  # one executemany per column set
                batch = [c for c in changes if "state" not in c and tuple(sorted(c)) == key_set]
                s.execute(update(JobRow), batch)
            self._write_moves(s, moves, snapshot)
            state = {"sharing_mode": view.sharing_mode.value, "tprof_s": view.tprof_s,
                     "nprof_gpus": view.nprof_gpus, "borrowed_nodes": list(view.borrowed_nodes),
                     "last_mode_check": view.last_mode_check, "sharing_reason": sharing_reason}
            from lucid_core.runtime.schema import SchedulerStateRow

            for key, value in state.items():
                row = s.get(SchedulerStateRow, key)
                if row is None:
                    s.add(SchedulerStateRow(key=key, value=value))
                elif row.value != value:
                    row.value = value
        return decisions

    def _write_moves(self, s: Any, moves: list[dict[str, Any]], snapshot: Snapshot) -> None:
        """Job field changes that include a state: each a compare-and-set on the state the snapshot saw."""
        if not moves:
            return
        table = JobRow.__table__
        for key_set in {tuple(sorted(c)) for c in moves}:
            batch = [{**{f"v_{k}": v for k, v in c.items()},
                      "seen": self._recorded_states.get(c["job_id"], snapshot.jobs[c["job_id"]].state)}
                     for c in moves if tuple(sorted(c)) == key_set]
            columns = [k for k in key_set if k != "job_id"]
            statement = (table.update()
                         .where(table.c.job_id == bindparam("v_job_id"), table.c.state == bindparam("seen"))
                         .values({k: bindparam(f"v_{k}") for k in columns}))
            changed = s.execute(statement, batch).rowcount
            if changed is not None and 0 <= changed < len(batch):
                self._conflict("(several)", f"{len(batch) - changed} job(s) changed state after this round read them")

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
                 for run, result in (_in_order(wanted, self._fan_out(batches, reads=True)) if wanted else [])}
        self.keep_lease()
        observed = observe_pair_speeds(snapshot, lambda run: texts.get((run.run_id, run.host)), now, settings)
        self._speeds = observed.estimates
        self.report.pair_speeds = {job_id: e.speed for job_id, e in observed.estimates.items()}
        snapshot.speed_reports = observed.reports

    @staticmethod
    def _record_predictions(s: Any, policy: Any, view: Any, decisions: list[Decision], now: float) -> None:
        """A job event per placement with the predicted duration it used, in words: `explain` shows what the
        decision used, not what the model says later (queued jobs are re-predicted every round)."""
        from lucid_core.runtime.explain import prediction_notes

        placed = [view.jobs[d.job_id] for d in decisions
                  if isinstance(d, Place) and d.job_id in view.jobs and not d.job_id.startswith(HOLD_PREFIX)]
        if placed:
            notes = prediction_notes(policy.describe().duration_model, placed)
            s.add_all([JobEventRow(job_id=job_id, time=now, kind="Predicted", message=note)
                       for job_id, note in notes.items()])

    def _record(self, s: Any, decision: Decision, view: Any, now: float, snapshot: Snapshot) -> None:
        kind = type(decision).__name__
        job_id = getattr(decision, "job_id", None)
        if job_id is not None and job_id.startswith(HOLD_PREFIX):
            return
        payload: dict[str, Any] = {}
        for name in getattr(decision, "__slots__", ()):
            value = getattr(decision, name)
            if name == "gpus":
                value = [[g.host, g.index] for g in value]
            elif hasattr(value, "value"):
                value = value.value
            payload[name] = value
        seen = snapshot.jobs.get(job_id) if job_id is not None else None
        if isinstance(decision, (StartProfiling, Place, StopProfiling, Preempt)):
            # compare-and-set: the job must still be in the state this round's snapshot saw
            target = {StartProfiling: JobState.PROFILING, Place: JobState.RUNNING}.get(type(decision), JobState.QUEUED)
            extra = {"attempts": JobRow.attempts + 1} if isinstance(decision, (StartProfiling, Place)) else {}
            if isinstance(decision, (StartProfiling, Place)):
                extra.update(pending_reason=None, queue_position=None)
            expected = self._recorded_states.get(job_id or "", seen.state if seen is not None else None)
            moved = expected is not None and s.execute(_update(JobRow).where(
                JobRow.job_id == job_id, JobRow.state == expected,
                JobRow.cancel_requested.is_not(True) if isinstance(decision, (StartProfiling, Place)) else true())
                .values(state=target.value, **extra)).rowcount == 1
            if not moved:
                self._conflict(job_id or "?", f"{kind}: the job left state {expected or 'unknown'} "
                                              "after this round read it; nothing recorded")
                return
            self._recorded_states[job_id] = target.value
        row = DecisionRow(round_id=self.report.round_id or 0, time=now, kind=kind, job_id=job_id,
                          payload=payload, reason=decision.reason, status="pending")
        s.add(row)
        s.flush()
        self.report.decisions.append((kind, job_id, decision.reason))
        if isinstance(decision, (StartProfiling, Place)):
            job = s.get(JobRow, decision.job_id)
            s.refresh(job)  # attempts as just counted
            alloc = view.allocations.get(decision.job_id)
            pool = alloc.pool if alloc is not None else (Pool.PROFILING if isinstance(decision, StartProfiling)
                                                         else Pool.MAIN)
            until = alloc.profiling_until if alloc is not None else None
            if isinstance(decision, StartProfiling):
                until = now + decision.window_s
            run_id = f"{job.job_id}-{'prof' if isinstance(decision, StartProfiling) else 'main'}{job.attempts}"
            by_host: dict[str, list[int]] = {}
            for ref in decision.gpus:
                by_host.setdefault(ref.host, []).append(ref.index)
            partner = decision.partner if isinstance(decision, Place) else None
            for rank, (host, indices) in enumerate(by_host.items()):
                s.add(RunRow(run_id=run_id, host=host, job_id=job.job_id,
                             kind="profiling" if isinstance(decision, StartProfiling) else "main",
                             pool=pool.value, gpu_indices=indices, node_rank=rank, partner=partner,
                             profile_in_place=isinstance(decision, Place) and decision.profile_in_place,
                             profiling_until=until, state="planned", decision_id=row.id, planned_at=now))
            if partner is not None:
                s.execute(_update(RunRow).where(RunRow.job_id == partner, RunRow.state.in_(("planned", "running")))
                          .values(partner=job.job_id, observed_speed=None, observed_speed_at=None,
                                  observed_speed_samples=None, observed_speed_emulated=None))  # a new pair
            self._event(s, job.job_id, kind, f"{_gpus_text(decision.gpus)}: {decision.reason}")
        elif isinstance(decision, (StopProfiling, Preempt)):
            reason = "profiling_window" if isinstance(decision, StopProfiling) else "preempt"
            s.execute(_update(RunRow).where(RunRow.job_id == decision.job_id, RunRow.state == "running")
                      .values(stop_reason=reason))
            s.execute(_update(RunRow).where(RunRow.job_id == decision.job_id, RunRow.state == "planned")
                      .values(state="ended", outcome=f"{reason} before launch", ended_at=now))
            self._event(s, decision.job_id, kind, decision.reason)
        elif isinstance(decision, Unpair):
            measured = "; ".join(f"{j}: {self._speeds[j].describe()}" for j in (decision.job_id, decision.partner)
                                 if j in self._speeds)
            for member in (decision.job_id, decision.partner):
                job = s.get(JobRow, member)
                if job is None:
                    continue
                job.no_share = True
                self._event(s, member, kind, decision.reason + (f" (measured {measured})" if measured else ""))
            row.status, row.executed_at = "done", now
        elif isinstance(decision, (SetSharingMode, SetProfilerParams)):
            row.status, row.executed_at = "done", now


def _in_order(items: list[RunRow], results: dict[str, list[CallResult[T]]]) -> list[tuple[RunRow, CallResult[T]]]:
    """Pair runs with their calls' results: each host's results come in the order its runs were batched."""
    taken: dict[str, int] = {}
    paired = []
    for run in items:
        index = taken.get(run.host, 0)
        taken[run.host] = index + 1
        paired.append((run, results[run.host][index]))
    return paired


def _value(result: CallResult[T]) -> T:
    """The call's value; a host's error other than unreachable is raised here, in the round's thread."""
    if result.error is not None:
        raise result.error
    return result.value  # type: ignore[return-value]


@functools.cache
def _agent_source() -> tuple[str, str]:
    """The telemetry agent's source and its content digest, read once per process (every launch ships it)."""
    import hashlib
    from pathlib import Path

    from lucid_core.runtime import telemetry_agent

    source = Path(telemetry_agent.__file__).read_text(encoding="utf-8")
    return source, hashlib.sha256(source.encode()).hexdigest()[:12]


def _update(model: Any) -> Any:
    """An UPDATE that skips syncing the session's objects (the rows it touches are re-read anyway)."""
    return update(model).execution_options(synchronize_session=False)


def _gpus_text(gpus: tuple[GpuRef, ...]) -> str:
    by_host: dict[str, list[int]] = {}
    for ref in gpus:
        by_host.setdefault(ref.host, []).append(ref.index)
    return " + ".join(f"{h}[{','.join(map(str, ix))}]" for h, ix in by_host.items())
