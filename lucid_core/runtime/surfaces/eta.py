"""`lucid eta`: when will a job start and end? Run the live policy forward from the live state.

The view is rebuilt exactly as a round builds it, taken as the simulator's start state, and the
simulator's own engine runs the same policy forward from it until the asked-for job has ended:
a what-if and a trace replay share one forward loop (pair slowdowns, profiling windows, wake-ups).
Jobs are assumed to run for their predicted durations and nobody else submits: it is a what-if,
not a promise. A running pair member whose speed the round has measured runs at that speed
until its pair changes, not at the speed its profile predicts. The policy decides only at rounds,
as often as the scheduler's recent rounds ran (`recent_cadence`): a job waits for the round after
its GPUs free, as live.

The what-if sees the cluster as the round does: hosts that take no new work (unreachable, draining,
cooling down) stay closed for the whole run (`StartState.closed`), and a run on an unreachable host
never ends in it (when it ends is not known). Where the answer cannot be known it says so instead of
giving a time: a waiting job kept out by closed hosts (named), one its VC can no longer hold
(`pending.never_fits`, the round's own words), and any job not yet running while rounds have stalled
(`round_age`: nothing starts until they resume).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import partial

from lucid_core.config import LucidConfig
from lucid_core.domain import TERMINAL_STATES, Job, JobState, Pool, RunState
from lucid_core.policy.base import SchedulingPolicy
from lucid_core.policy.orchestrator import floored_prediction
from lucid_core.policy.predictors import DEFAULT_DURATION_S
from lucid_core.policy.view import ClusterView, saved_float
from lucid_core.runtime.round.live_models import PolicyFactory, default_policy
from lucid_core.runtime.round.pending import never_fits
from lucid_core.runtime.round.snapshot import Snapshot as StoreSnapshot
from lucid_core.runtime.round.snapshot import load_snapshot
from lucid_core.runtime.round.view_builder import BuiltView, build_view
from lucid_core.runtime.store.store import Store
from lucid_core.runtime.surfaces.round_age import CADENCE_ROUNDS, median_gap, round_starts, stalled_words
from lucid_core.sim.engine import simulate
from lucid_core.sim.rounds import RoundCadence
from lucid_core.sim.start import StartState, Until
from lucid_core.units import duration_words

MIN_MEASURED_RATE = 0.01  # a pair measured as stalled still ends in the what-if (at 100x its duration)


@dataclass(frozen=True)
class Eta:
    job_id: str
    state: str
    start: float | None
    end: float | None
    predicted_duration: float | None
    steps: int
    note: str


def assumed_durations(policy: SchedulingPolicy, jobs: Sequence[Job]) -> list[float]:
    """Each job's whole work in the what-if: its predicted duration, else what the policy's model
    predicts now (floored as the orchestrator floors a prediction), else an hour."""
    missing = [job for job in jobs if job.predicted_duration is None]
    model = policy.describe().duration_model
    predicted = {}
    if missing:
        raw = model.predict_duration(missing) if model is not None else [DEFAULT_DURATION_S] * len(missing)
        predicted = {job.job_id: floored_prediction(job, p)
                     for job, p in zip(missing, raw, strict=True)}
    return [float(job.predicted_duration) if job.predicted_duration is not None else predicted[job.job_id]
            for job in jobs]


def measured_rates(snapshot: StoreSnapshot) -> dict[str, float]:
    """The speed the round last measured for each running main run that has a partner (rank 0).

    A new partner clears the stored speed, so each figure belongs to the job's current pair; one
    of a job whose partner has ended is ignored by the engine (it only slows pairs).
    """
    return {r.job_id: max(MIN_MEASURED_RATE, min(1.0, speed)) for r in snapshot.runs
            if r.kind == "main" and r.node_rank == 0 and r.state == RunState.RUNNING and r.partner is not None
            and (speed := saved_float(r.observed_speed)) is not None}  # text a hand edit left: not measured


def recent_cadence(store: Store, now: float, rounds: int = CADENCE_ROUNDS) -> RoundCadence | None:
    """Rounds as the scheduler has been running them: the median gap (`round_age.median_gap`) between the starts
    of its last `rounds` rounds, from the last one. None (decide at every event) without a cadence to go by, or
    when the last round started over ten gaps ago (paused)."""
    return cadence_of(round_starts(store, now, rounds), now)


def cadence_of(starts: list[float], now: float) -> RoundCadence | None:
    """`recent_cadence` of round starts already read (`round_age.round_starts`)."""
    interval = median_gap(starts)
    if interval is None or now - starts[-1] > 10 * interval:
        return None
    return RoundCadence.every(interval, origin_s=starts[-1])


def estimate(store: Store, job_id: str, config: LucidConfig, now: float, *,
             policy_factory: PolicyFactory | None = None, horizon_s: float = 30 * 86400.0,
             max_steps: int = 100000) -> Eta:
    """Start and end of `job_id` if the current policy kept deciding on the current cluster, seen as a round
    sees it; where that cannot be known (rounds stalled, hosts away, a VC too small for it) the answer says so."""
    from lucid_core.runtime.store.schema import JobRow

    with store.session() as s:
        row = s.get(JobRow, job_id)
        if row is None:
            raise KeyError(job_id)
        state = JobState(row.state)
        if state in TERMINAL_STATES:
            return Eta(job_id, state.value, row.start_time, row.end_time, row.predicted_duration, 0, "already ended")
    snapshot = load_snapshot(store, now)
    rates = measured_rates(snapshot)
    built = build_view(snapshot, config, now, policy_factory or default_policy)
    if job_id in built.unreadable:  # not a stop pending: the round leaves the job out until its row is mended
        return Eta(job_id, state.value, None, None, None, 0, built.unreadable[job_id])
    starts = round_starts(store, now)  # read once: the what-if's cadence and whether rounds stalled
    eta = _live_what_if(built, job_id, state.value, rates=rates, rounds=cadence_of(starts, now),
                        horizon_s=horizon_s, max_steps=max_steps)
    stalled = stalled_words(starts, now)
    return eta if stalled is None else _while_stalled(eta, stalled, now)


def _live_what_if(built: BuiltView, job_id: str, state: str, *, rates: Mapping[str, float],
                  rounds: RoundCadence | None, horizon_s: float, max_steps: int) -> Eta:
    """`estimate_in_view` on a round's view, the cluster as the round sees it: a run on an unreachable host never
    ends (nobody knows when it will), closed hosts stay closed, and a waiting job its VC can no longer hold, or
    one kept out by closed hosts, is told so instead of a time."""
    view = built.view
    target, alloc = view.jobs.get(job_id), view.allocations.get(job_id)
    if target is not None and alloc is None:
        never = never_fits(view, target.gpus, view.placement_vc(target), built.leaving)
        if never is not None:
            return Eta(job_id, state, None, None, target.predicted_duration, 0, never)
    held = built.never_ending()
    if alloc is not None and job_id in held:
        away = "; ".join(f"{h} {built.closed[h]}" for h in sorted({r.host for r in alloc.gpus} & built.closed.keys()))
        return Eta(job_id, state, alloc.start, None, target.predicted_duration if target else None, 0,
                   f"running on a host that does not answer ({away}): when it ends is not known until it answers")
    eta = estimate_in_view(view, built.policy, job_id, state=state, held=held, horizon_s=horizon_s,
                           max_steps=max_steps, rates=rates, rounds=rounds)
    if eta.start is not None or target is None or alloc is not None:
        return eta
    vc = view.placement_vc(target)
    blockers = [f"{h} {why}" for h, why in sorted(built.closed.items())
                if (h in view.main.nodes and view.main.nodes[h].vc == vc)
                or (h in view.profiling.nodes and job_id in view.profiling_queue)]
    if not blockers:
        return eta
    return replace(eta, note=f"not placed while hosts it could use take no new work ({'; '.join(blockers)}): when "
                             f"they take work again is not known ({eta.note})")


def _while_stalled(eta: Eta, stalled: str, now: float) -> Eta:
    """`eta` when rounds have stalled: a job not yet running has no start until they resume (the what-if is
    told as what would follow if they resumed now); a running job keeps its predicted end, with the warning."""
    if eta.state == JobState.RUNNING.value:
        return replace(eta, note=f"{stalled}; {eta.note}")
    if eta.start is not None:
        then = f"were they to resume now, it would start in about {duration_words(max(0.0, eta.start - now))}"
    else:
        then = f"were they to resume now: {eta.note}"
    return replace(eta, start=None, end=None, note=f"{stalled}; {then}")


def _overrun_words(started: float | None, now: float, duration: float) -> str | None:
    """What the answer says of a running job past its whole predicted duration (the what-if can only end it at
    once), or None while it is within it."""
    began = saved_float(started)
    if began is None or now - began <= duration:
        return None
    return (f"running longer than its predicted {duration_words(duration)} ({duration_words(now - began)} so far): "
            "when it ends is not known; the what-if ends it now")


def estimate_in_view(view: ClusterView, policy: SchedulingPolicy, job_id: str, *, state: str | None = None,
                     held: Collection[str] = (), horizon_s: float = 30 * 86400.0,
                     max_steps: int = 100000, rates: Mapping[str, float] | None = None,
                     rounds: RoundCadence | None = None) -> Eta:
    """Start and end of `job_id` when the simulator's engine runs `policy` on from `view` (at
    `view.now`, which the run changes): no submissions, `held` allocations never end, running
    pair members in `rates` run at those measured speeds (see `StartState`), the policy decides at
    `rounds` (None: at every event).

    `steps` is the number of scheduling rounds the what-if took.
    """
    target = view.jobs.get(job_id)
    if target is None:
        return Eta(job_id, state or "", None, None, None, 0, "job is not in the scheduler's view (stop pending)")
    state = state or target.state.value
    alloc = view.allocations.get(job_id)
    was_running = alloc is not None and alloc.pool is Pool.MAIN
    asked_at = view.now  # the what-if moves the view's clock
    start = StartState.from_view(view, partial(assumed_durations, policy), held=held, rates=rates)
    duration = next((r.duration for r in start.jobs if r.job_id == job_id), None)
    if duration is None:
        return Eta(job_id, state, target.start_time, target.end_time, target.predicted_duration, 0,
                   "neither running nor waiting in the scheduler's view")
    result = simulate([], policy, view.config, start=start, rounds=rounds,
                      until=Until(job_finished=job_id, time=start.now + horizon_s, rounds=max_steps))
    outcome = next((o for o in result.outcomes if o.job_id == job_id), None)
    if outcome is not None:
        note = "running: predicted end" if was_running else "placed in the what-if run of the live policy"
        if was_running and (overrun := _overrun_words(target.start_time, asked_at, duration)):
            note = overrun
        return Eta(job_id, state, outcome.start_time, outcome.end_time, duration, result.rounds, note)
    limit = (f"{horizon_s / 86400:g} days of simulated time" if result.stopped_by == "time"
             else f"{max_steps} scheduling rounds")
    placed = view.allocations.get(job_id)
    if placed is not None and placed.pool is Pool.MAIN:
        return Eta(job_id, state, placed.start, None, duration, result.rounds, f"placed; not ended within {limit}")
    if result.stopped_by == "idle":
        return Eta(job_id, state, None, None, duration, result.rounds,
                   "never placed: nothing running ends and the policy waits for nothing")
    return Eta(job_id, state, None, None, duration, result.rounds, f"not placed within {limit}")
