"""The state one scheduling round holds and its basic moves: the lease, host bookkeeping, events.

Every step module (launching, settling, profiles, decisions, hosts) builds on `RoundBase`;
`round.SchedulingRound` composes them. Writes go through `self.store`, fenced on the round's lease.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from sqlalchemy import and_, case, func, select, update

from lucid_core.config import LucidConfig
from lucid_core.domain import TERMINAL_STATES, GpuRef
from lucid_core.policy.view import saved_float, saved_number
from lucid_core.runtime.hosts.calls import CallResult, HostCall, HostCallPool
from lucid_core.runtime.hosts.executor import (
    HostCommandFailed,
    HostExecutor,
    HostUnreachable,
)
from lucid_core.runtime.hosts.telemetry import (
    SpeedEstimate,
)
from lucid_core.runtime.round.live_models import PolicyFactory, default_policy
from lucid_core.runtime.round.settings import (
    EmulatedProfileFn,
    InjectedCrash,
    RoundReport,
    RoundSettings,
)
from lucid_core.runtime.store import lease
from lucid_core.runtime.store.schema import (
    HostRow,
    JobEventRow,
    RoundRow,
    RunRow,
)
from lucid_core.runtime.store.store import Store

_log = logging.getLogger("lucid.round")
TERMINAL_VALUES = tuple(state.value for state in TERMINAL_STATES)
MAX_STORED_SAMPLES = 2000
WATCH_S = 30 * 86400.0  # a watching agent's limit; it stops with its job long before
REFUSED = "launch refused"  # how a cool-down's reason begins (`_cool_down`)
FINITE_BOUND = 1e300  # below it: a stored time that is a finite number (SQL has no isfinite)
T = TypeVar("T")


def cancelled_reason(session: Any, job_id: str) -> str:
    """A cancelled job's end reason, naming who asked as its first cancel request's event says ("cancelled by ana
    (lucid cancel)"); the event's text is stored input, so one line, bounded."""
    from lucid_core.units import one_line

    asked = session.scalar(select(JobEventRow.message).where(
        JobEventRow.job_id == job_id, JobEventRow.kind == "cancel_requested").order_by(JobEventRow.id).limit(1))
    words = "".join(c if c.isprintable() else "?" for c in one_line(asked, 200))  # a hand-written row's escapes
    if words.startswith("cancel requested by "):
        return "cancelled by " + words.removeprefix("cancel requested by ")
    return "cancelled by request"


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Python's cycle collector off while a round reads, decides and writes: it makes tens of thousands of
    short-lived acyclic records, and the collector's passes over them cost about a fifth of the step. A
    pass that falls due meanwhile runs after the round, where it no longer counts against its deadline
    (in a process that also holds models and earlier rounds' objects, a full pass cost 140 ms)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


class RoundBase:
    """What every step of a round shares: the store (fenced), the executor, settings, clock and report."""

    def __init__(self, store: Store, executor: HostExecutor, config: LucidConfig,
                 settings: RoundSettings | None = None, *, policy_factory: PolicyFactory | None = None,
                 emulated_profile: EmulatedProfileFn | None = None,
                 clock: Callable[[], float] | None = None, crash_at: str | None = None,
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
        # the database's time (one clock for every controller and submitter) unless a test steps time by hand
        self.clock = clock if clock is not None else store.clock()
        self.crash_at = crash_at
        self.report = RoundReport()
        self._hosts: dict[str, HostRow] = {}
        self._speeds: dict[str, SpeedEstimate] = {}  # this round's pair speed estimates, per job
        self._recorded_states: dict[str, str] = {}  # job states this round's decisions just set
        self._ended_read: set[tuple[str, str]] = set()  # ended runs whose window this round already read
        self._settled: set[tuple[str, str]] = set()  # runs this round recorded as ended (their windows may be due)
        self.previous_start: float | None = None  # when the round before this one started (`open_round`)
        self.now = self.clock()

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
        # hosts that did not answer last time start first: their deadline then runs beside the others' calls
        # instead of after them, when there are more hosts than workers
        order = sorted(batches, key=lambda name: bool(self._hosts[name].reachable) if name in self._hosts else True)
        return self.calls.run({host: [HostCall(call, deadline) for call in batches[host]] for host in order},
                              limit_s=deadline, tick=self.keep_lease if reads else None)

    def take_lease(self) -> bool:
        """Take the store's round lease with a new fencing generation; from here on every write of this
        round is conditional on it (see `lease`). False when another round or an admin command holds it."""
        taken = lease.acquire(self.raw_store, self.settings.holder, self.settings.lease_ttl_s)
        if taken is None:
            return False
        self.lease, self._renewed_at = taken, time.monotonic()
        self.store = self.raw_store.fenced(taken)
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
            # a run the round before saw running ended after it started (`settling.ended_at`)
            self.previous_start = saved_float(s.scalar(select(RoundRow.started_at).where(RoundRow.id < row.id)
                                                       .order_by(RoundRow.id.desc()).limit(1)))

    def renew_lease(self) -> None:
        """Before acting on a host: make sure this round still holds the lease (and extend it); raises
        `lease.Fenced` when another took it over, so a stale round launches and stops nothing."""
        if self.lease is not None:
            lease.renew(self.raw_store, self.lease)
            self._renewed_at = time.monotonic()

    def keep_lease(self) -> None:
        """Renew the lease during a long step once a quarter of its TTL has passed since the last renewal."""
        if self.lease is not None and time.monotonic() - self._renewed_at > self.lease.ttl_s / 4:
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
            s.execute(update_unsynced(RoundRow).where(RoundRow.id == self.report.round_id).values(
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
            s.execute(update_unsynced(HostRow)
                .where(HostRow.name == name).values(reachable=False, last_error=str(exc)[:1000]))

    def _cool_down(self, name: str, why: str) -> None:
        """A host that refused a launch (disk full, broken environment) gets no new work for a while."""
        until = self.clock() + self.settings.host_cooldown_s
        with self.store.session() as s:
            s.execute(update_unsynced(HostRow).where(HostRow.name == name).values(
                cooldown_until=until, last_error=f"{REFUSED}: {why}"[:1000]))

    def _host_seen(self, name: str) -> None:
        """Mark a host that answered as reachable; last_seen is refreshed at most every 30 s per host (half the
        idle probes' interval when shorter). A cool-down's reason stays while it lasts."""
        host, now = self._hosts.get(name), self.clock()
        refused = host is not None and saved_number(host.cooldown_until) and host.cooldown_until > now and (
            str(host.last_error or "").startswith(REFUSED))
        refresh_s = min(30.0, self.settings.idle_probe_s / 2) if self.settings.idle_probe_s else 30.0
        if (host is not None and host.reachable and (host.last_error is None or refused)
                and saved_number(host.last_seen) and 0 <= now - host.last_seen < refresh_s):
            return
        # decided in SQL: a cool-down this round recorded after its host list was read keeps its reason too. As
        # `saved_number` reads it: text, NaN and infinities (above any number in SQLite's and PostgreSQL's order)
        # are no cool-down; the prefix compared case-sensitively on both (SQLite's LIKE ignores case)
        lasting = and_(HostRow.cooldown_until > now, HostRow.cooldown_until < FINITE_BOUND,
                       func.substr(HostRow.last_error, 1, len(REFUSED)) == REFUSED)
        values = {"reachable": True, "last_seen": now, "last_error": case((lasting, HostRow.last_error), else_=None)}
        with self.store.session() as s:
            s.execute(update_unsynced(HostRow).where(HostRow.name == name).values(**values))

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
        return call_value(result)

    def _conflict(self, job_id: str, what: str) -> None:
        """Another writer changed the row first: back off, say so, change nothing (no host is blamed)."""
        message = f"job {job_id}: conflict {what}"
        self.report.conflicts.append(message)
        _log.info("round %s: %s", self.report.round_id, message)

    def _event_once(self, job_id: str, kind: str, message: str) -> None:
        """An event for the job unless the same one is already recorded (a round repeats what it sees)."""
        with self.store.session() as s:
            seen = s.scalar(select(JobEventRow.id).where(JobEventRow.job_id == job_id, JobEventRow.kind == kind,
                                                         JobEventRow.message == message[:1000]).limit(1))
            if seen is None:
                self._event(s, job_id, kind, message[:1000])


def pair_results(items: list[RunRow], results: dict[str, list[CallResult[T]]]) -> list[tuple[RunRow, CallResult[T]]]:
    """Pair runs with their calls' results: each host's results come in the order its runs were batched."""
    taken: dict[str, int] = {}
    paired = []
    for run in items:
        index = taken.get(run.host, 0)
        taken[run.host] = index + 1
        paired.append((run, results[run.host][index]))
    return paired


def call_value(result: CallResult[T]) -> T:
    """The call's value; a host's error other than unreachable is raised here, in the round's thread."""
    if result.error is not None:
        raise result.error
    return result.value  # type: ignore[return-value]


@functools.cache
def agent_source() -> tuple[str, str]:
    """The telemetry agent's source and its content digest, read once per process (every launch ships it)."""
    import hashlib
    from pathlib import Path

    from lucid_core.runtime.hosts import telemetry_agent
    source = Path(telemetry_agent.__file__).read_text(encoding="utf-8")
    return source, hashlib.sha256(source.encode()).hexdigest()[:12]


def update_unsynced(model: Any) -> Any:
    """An UPDATE that skips syncing the session's objects (the rows it touches are re-read anyway)."""
    return update(model).execution_options(synchronize_session=False)


def gpus_text(gpus: tuple[GpuRef, ...]) -> str:
    by_host: dict[str, list[int]] = {}
    for ref in gpus:
        by_host.setdefault(ref.host, []).append(ref.index)
    return " + ".join(f"{h}[{','.join(map(str, ix))}]" for h, ix in by_host.items())
