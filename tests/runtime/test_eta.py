"""`lucid eta` on a cluster with a running pair, a profiling window and a queue, computed by hand.

The view is built the way the live round builds it (allocations re-created at their start
times, waiting jobs re-entered through the policy's hooks); the what-if then runs in the
simulator's engine, so the pair slows down from its measured profiles.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from lucid_core.config import LucidConfig
from lucid_core.domain import GpuRef, Job, Pool, Profile
from lucid_core.policy.lucid import LucidPolicy
from lucid_core.policy.view import ClusterView
from lucid_core.runtime.store.schema import RoundRow
from lucid_core.runtime.store.store import Store
from lucid_core.runtime.surfaces.eta import estimate_in_view, recent_cadence
from lucid_core.sim.rounds import RoundCadence

NOW = 1000.0
# 1 main node and 1 profiling node of 2 GPUs; 300 s windows; sharing always on
CONFIG = LucidConfig().with_overrides({"cluster.gpus_per_node": 2, "profiler.tprof_s": 300,
                                       "profiler.in_place": False, "profiler.autoscale": False,
                                       "binder.sharing": "on"})
MEDIUM = Profile(60.0, 30.0, 4000.0)  # two of them: 120 % of a GPU, each runs at 1/1.2 of its speed
JUMBO = Profile(90.0, 50.0, 8000.0)  # never shares with another Jumbo


class TableDurations:
    """Duration predictions read from a table (what a promoted model would say for these jobs)."""

    def __init__(self, seconds: dict[str, float]) -> None:
        self.seconds = seconds

    def predict_duration(self, jobs: Sequence[Job]) -> list[float]:
        return [self.seconds[job.job_id] for job in jobs]

    def observe(self, job: Job, duration: float) -> None:
        return None


def _job(job_id: str, submit: float, profile: Profile | None, predicted: float | None) -> Job:
    return Job(job_id=job_id, user="ann", vc="", gpus=1, submit_time=submit, profile=profile,
               predicted_duration=predicted)


def _run(view: ClusterView, policy: LucidPolicy, job: Job, pool: Pool, gpu: GpuRef, since: float,
         partner: str | None = None, window_end: float | None = None) -> None:
    """Re-create a run as the view builder does: allocation at its start time, profile learned."""
    if job.profile is not None:
        job.share_class = policy.binder.classify(job.profile)
    view.add_job(job)
    view.now = since
    view.start(job.job_id, pool, (gpu,), partner=partner, profiling_until=window_end)
    view.now = NOW
    if partner is None and pool is Pool.MAIN:
        view.refresh_share_candidate(job.job_id)


def _cluster() -> tuple[ClusterView, LucidPolicy]:
    """At t=1000: A (since 0, predicted 3000 s) and B (since 400, predicted 2000 s) share GPU 0;
    C (since 200, predicted 1500 s) runs alone on GPU 1; R is in its profiling window on the pool
    (900..1200, the model predicts 1000 s, its profile will say Jumbo); Q (Jumbo, the model
    predicts 600 s) waits in the main queue."""
    policy = LucidPolicy(CONFIG, duration_model=TableDurations({"Q": 600.0, "R": 1000.0}))
    view = ClusterView(CONFIG, now=NOW)
    view.add_nodes(Pool.MAIN, 1)
    view.add_nodes(Pool.PROFILING, 1)
    node, prof = next(iter(view.main.nodes)), next(iter(view.profiling.nodes))
    _run(view, policy, _job("A", 0.0, MEDIUM, 3000.0), Pool.MAIN, GpuRef(node, 0), 0.0)
    _run(view, policy, _job("B", 400.0, MEDIUM, 2000.0), Pool.MAIN, GpuRef(node, 0), 400.0, partner="A")
    _run(view, policy, _job("C", 200.0, JUMBO, 1500.0), Pool.MAIN, GpuRef(node, 1), 200.0)
    _run(view, policy, _job("R", 900.0, None, None), Pool.PROFILING, GpuRef(prof, 0), 900.0, window_end=1200.0)
    view.profile_of = {"R": JUMBO}.get  # what R's telemetry will have measured when its window closes
    queued = _job("Q", 500.0, None, None)
    view.add_job(queued)
    policy.on_profiled(view, queued, JUMBO)
    return view, policy


# By hand: the pair runs at 1/1.2 from now (before, it is taken to have run at full speed).
# B has 2000 - 600 = 1400 s of work left: ends 1000 + 1.2 x 1400 = 2680. A has done 1400 of its
# 2000 s left by then and runs the last 600 s alone: ends 3280. C ends 200 + 1500 = 1700.
# R's window closes at 1200: it joins the main queue behind Q (600 GPU-s < 1000 GPU-s); neither
# Jumbo may share. C's GPU frees at 1700: Q runs 1700..2300, then R 2300..3300 (from scratch).
EXPECTED = {"A": (0.0, 3280.0), "B": (400.0, 2680.0), "C": (200.0, 1700.0),
            "Q": (1700.0, 2300.0), "R": (2300.0, 3300.0)}


@pytest.mark.parametrize("job_id", sorted(EXPECTED))
def test_eta_with_a_running_pair_a_profiling_window_and_a_queue(job_id):
    view, policy = _cluster()
    eta = estimate_in_view(view, policy, job_id)
    assert (eta.start, eta.end) == pytest.approx(EXPECTED[job_id], abs=1e-6), eta
    assert eta.note == ("running: predicted end" if job_id in "ABC" else "placed in the what-if run of the live policy")
    assert eta.steps >= 1


def test_eta_says_when_the_job_is_never_placed_or_not_within_the_horizon():
    view, policy = _cluster()
    eta = estimate_in_view(view, policy, "R", horizon_s=1000.0)  # R starts 1300 s from now
    assert (eta.start, eta.end) == (None, None) and eta.note == "not placed within 0.0115741 days of simulated time"
    policy = LucidPolicy(CONFIG, duration_model=TableDurations({"W": 600.0}))
    view = ClusterView(CONFIG, now=NOW)
    view.add_nodes(Pool.MAIN, 1)
    view.add_job(Job(job_id="~hold", user="~", vc="~", gpus=1, submit_time=NOW, no_share=True))
    view.start("~hold", Pool.MAIN, (GpuRef(next(iter(view.main.nodes)), 1),))  # a host that takes no work
    wide = Job(job_id="W", user="ann", vc="", gpus=2, submit_time=NOW)
    view.add_job(wide)
    policy.on_profiled(view, wide, JUMBO)
    eta = estimate_in_view(view, policy, "W", held=["~hold"])
    # one round decides nothing; the starvation guard may ask for one more when W would become overdue
    assert (eta.start, eta.end) == (None, None) and eta.steps <= 2
    assert eta.note == "never placed: nothing running ends and the policy waits for nothing"


def test_eta_waits_for_the_rounds_as_the_scheduler_runs_them():
    """The same cluster with rounds every 60 s, the last at 970: R's window closing at 1200 is seen at 1210, C's
    GPU freed at 1700 is reused at the round at 1750 (Q 1750..2350) and R starts at the round at 2350."""
    rounds = RoundCadence.every(60.0, origin_s=970.0)
    expected = {**EXPECTED, "Q": (1750.0, 2350.0), "R": (2350.0, 3350.0)}
    for job_id in sorted(expected):
        view, policy = _cluster()
        eta = estimate_in_view(view, policy, job_id, rounds=rounds)
        assert (eta.start, eta.end) == pytest.approx(expected[job_id], abs=1e-6), (job_id, eta)


def _rounds_store(tmp_path: Path, starts: Sequence[float]) -> Store:
    store = Store(f"sqlite:///{tmp_path / 'lucid.db'}")
    with store.session() as s:
        s.add_all(RoundRow(holder="h", started_at=t) for t in starts)
    return store


@pytest.mark.parametrize(("starts", "now", "expected"), [
    ([1000.0, 1060.0, 1121.0, 1180.0, 1239.0], 1250.0, (59.0, 1239.0)),  # the lower median gap, from the last round
    ([1000.0, 1060.0, 1120.0, 1180.0, 5000.0], 1190.0, (60.0, 1180.0)),  # a round stamped in the future: left out
    ([1000.0, 87400.0, 87460.0, 87520.0], 87530.0, (60.0, 87520.0)),  # a day's pause, then rounds a minute apart
    ([0.0, 60.0, 1.7e9, 1.7e9 + 60, 1.7e9 + 120], 1.7e9 + 130, (60.0, 1.7e9 + 120)),  # a clock set at boot
    ([-1e308, -5e307, 990.0, 1050.0], 1060.0, None),  # odd rows: the median gap is no cadence
    ([1000.0, 4700.0, 8400.0, 12100.0], 12110.0, None),  # rounds over an hour apart: no cadence to go by
    ([1000.0, 1060.0, 1120.0], 1130.0, None),  # two gaps say little of a cadence
    ([1000.0, 1060.0, 1120.0, 1180.0], 1180.0 + 601.0, None),  # paused for over ten gaps
    ([], 10.0, None),
])
def test_the_cadence_is_the_median_gap_of_the_recent_rounds(tmp_path: Path, starts, now, expected):
    store = _rounds_store(tmp_path, starts)
    try:
        cadence = recent_cadence(store, now)
    finally:
        store.dispose()
    assert (None if cadence is None else (cadence.interval_s, cadence.origin_s)) == expected


def test_a_running_job_past_its_predicted_duration_says_its_end_is_not_known():
    """C (since 200, predicted 1500 s) read at t=2500 has run 2300 s: the what-if can only end it at once, and the
    answer says so instead of calling that its predicted end."""
    view, policy = _cluster()
    view.now = 2500.0
    eta = estimate_in_view(view, policy, "C")
    assert eta.note.startswith("running longer than its predicted 25.0 min (38.3 min so far)"), eta.note
    assert eta.end == 2500.0  # ended at once in the what-if, as said
    assert estimate_in_view(*_cluster(), "A").note == "running: predicted end"  # within its 3000 s


# --- the what-if on a live cluster (local hosts, real job processes): it sees the cluster as a round does ---

NO_PROFILING = {"profiler.enabled": False, "binder.sharing": "off"}


def _two_hosts(store: Store, root: Path) -> None:
    """Main hosts m0 and m1 of VC vc-a, 2 emulated GPUs each, on this machine; no profiling pool."""
    from lucid_core.runtime.hosts.inventory import HostSpec, add_host

    for name in ("m0", "m1"):
        add_host(store, HostSpec(name, executor="local", vc="vc-a", telemetry="emulated", gpus=2,
                                 workdir=str(root / name)))


def _rounds(store: Store, done, timeout_s: float = 20.0) -> dict:
    """Rounds (local executor, no profiling) until `done(jobs)`."""
    import time

    from runtime_helpers import SETTINGS, fast_config, jobs_by_id

    from lucid_core.runtime.hosts.local_executor import local_executor
    from lucid_core.runtime.round.scheduling_round import SchedulingRound

    deadline = time.monotonic() + timeout_s
    while True:
        SchedulingRound(store, local_executor(), fast_config(**NO_PROFILING), SETTINGS).run()
        jobs = jobs_by_id(store)
        if done(jobs):
            return jobs
        assert time.monotonic() < deadline, {j: (r.state, r.pending_reason) for j, r in jobs.items()}
        time.sleep(0.2)


def _host_of(store: Store, job_id: str) -> str:
    from runtime_helpers import runs_of

    return next(r.host for r in runs_of(store, job_id) if r.state == "running")


def _cancel_all(store: Store, *job_ids: str) -> None:
    from lucid_core.runtime.surfaces.submission import cancel

    for job_id in job_ids:
        cancel(store, job_id)
    _rounds(store, lambda jobs: all(jobs[j].state == "CANCELLED" for j in job_ids))


def test_eta_keeps_a_draining_host_closed_after_its_job_ends_in_the_what_if(store, tmp_path):
    """A 4-GPU job needs both 2-GPU hosts; one runs a 2-GPU job and is draining. The what-if ends that job, but the
    draining host takes no new work: the wide job is never placed, and the answer names the host (it used to start
    the job there once the running one was predicted to end). A draining host still counts toward what the VC can
    hold: the pending reason does not call the job unfittable."""
    import time

    from runtime_helpers import fast_config

    from lucid_core.runtime.hosts.inventory import drain_host
    from lucid_core.runtime.surfaces.eta import estimate
    from lucid_core.runtime.surfaces.submission import JobRequest, submit

    _two_hosts(store, tmp_path)
    running = submit(store, JobRequest("sleep 60", 2, "ann", "vc-a"))
    _rounds(store, lambda jobs: jobs[running].state == "RUNNING")
    busy = _host_of(store, running)
    wide = submit(store, JobRequest("sleep 1", 4, "ann", "vc-a"))
    drain_host(store, busy)
    jobs = _rounds(store, lambda jobs: jobs[wide].state == "QUEUED" and jobs[wide].pending_reason)
    assert "cannot fit" not in jobs[wide].pending_reason
    eta = estimate(store, wide, fast_config(**NO_PROFILING), time.time())
    assert (eta.start, eta.end) == (None, None), eta
    assert eta.note.startswith("not placed while hosts it could use take no new work"), eta.note
    assert f"{busy} draining" in eta.note
    drain_host(store, busy, draining=False)
    assert estimate(store, wide, fast_config(**NO_PROFILING), time.time()).start is not None  # open again: a time
    _cancel_all(store, running, wide)


def test_eta_queue_and_status_say_when_rounds_have_stalled(store, store_url, tmp_path, capsys):
    """Rounds ran a few times, then stopped ten minutes ago (their rows moved back): `lucid eta` gives a waiting job
    no start (nothing starts until rounds resume) and says why; `queue` and `status` warn that what they show may
    be out of date. While rounds keep their pace nobody warns."""
    import time

    from runtime_helpers import fast_config
    from sqlalchemy import update

    from lucid_core.cli import main
    from lucid_core.runtime.surfaces.eta import estimate
    from lucid_core.runtime.surfaces.submission import JobRequest, submit

    _two_hosts(store, tmp_path)
    running = submit(store, JobRequest("sleep 60", 4, "ann", "vc-a"))
    _rounds(store, lambda jobs: jobs[running].state == "RUNNING")
    waiting = submit(store, JobRequest("sleep 1", 1, "ann", "vc-a"))
    for _ in range(4):  # a cadence: rounds 0.2 s apart
        _rounds(store, lambda jobs: True)
        time.sleep(0.2)
    config = fast_config(**NO_PROFILING)
    assert estimate(store, waiting, config, time.time()).start is not None
    assert main(["queue", "--store", store_url]) == 0 and "rounds stalled" not in capsys.readouterr().err
    with store.session() as s:
        s.execute(update(RoundRow).values(started_at=RoundRow.started_at - 600.0,
                                          ended_at=RoundRow.ended_at - 600.0))
    eta = estimate(store, waiting, config, time.time())
    assert (eta.start, eta.end) == (None, None), eta
    assert eta.note.startswith("rounds stalled: no scheduling round has started for 10."), eta.note  # 10.0-10.1 min
    assert "nothing starts" in eta.note and "were they to resume now" in eta.note
    busy = estimate(store, running, config, time.time())
    assert busy.end is not None and busy.note.startswith("rounds stalled")  # its end is still predicted
    for argv in (["queue"], ["status", running]):
        assert main([*argv, "--store", store_url]) == 0
        err = capsys.readouterr().err
        assert f"lucid {argv[0]}: warning: rounds stalled: no scheduling round has started for 10." in err, err
    _cancel_all(store, running, waiting)


def test_a_job_its_vc_can_no_longer_hold_is_told_so_after_a_host_is_removed(store, store_url, tmp_path, capsys):
    """A 4-GPU job waits behind a 2-GPU one; `lucid hosts drain m1 --remove` (m1 idle) leaves VC vc-a 2 GPUs. The
    drain warns naming the job; the round's reason and eta say it cannot fit the VC as it is now and what would let
    it run; the job is not failed (a host may come back), and once one is added it runs."""
    import time

    from runtime_helpers import fast_config

    from lucid_core.cli import main
    from lucid_core.runtime.hosts.inventory import HostSpec, add_host
    from lucid_core.runtime.surfaces.eta import estimate
    from lucid_core.runtime.surfaces.submission import JobRequest, submit

    _two_hosts(store, tmp_path)
    running = submit(store, JobRequest("sleep 60", 2, "ann", "vc-a"))
    _rounds(store, lambda jobs: jobs[running].state == "RUNNING")
    idle = "m1" if _host_of(store, running) == "m0" else "m0"
    wide = submit(store, JobRequest("sleep 1", 4, "ann", "vc-a"))
    _rounds(store, lambda jobs: jobs[wide].state == "QUEUED")
    assert main(["hosts", "drain", idle, "--remove", "--store", store_url]) == 0
    err = capsys.readouterr().err
    assert f"warning: once {idle} is removed, VC vc-a's main hosts have 2 GPU(s): waiting job(s) {wide} (4 GPUs) " \
           "no longer fit" in err, err
    assert f"lucid hosts drain {idle} --undo" in err
    jobs = _rounds(store, lambda jobs: "cannot fit" in (jobs[wide].pending_reason or ""))
    assert f"lucid hosts drain {idle} --undo" in jobs[wide].pending_reason  # being removed: it can still be undone
    jobs = _rounds(store, lambda jobs: "undo" not in (jobs[wide].pending_reason or "x"))  # removed
    assert jobs[wide].state == "QUEUED"
    assert jobs[wide].pending_reason.startswith(
        "cannot fit VC vc-a as it is now: it needs 4 GPU(s), its main hosts have 2 GPU(s) (")
    assert "lucid hosts add ... --vc vc-a" in jobs[wide].pending_reason and "cancel it" in jobs[wide].pending_reason
    eta = estimate(store, wide, fast_config(**NO_PROFILING), time.time())
    assert eta.start is None and jobs[wide].pending_reason.startswith(eta.note) and "cancel it" in eta.note, eta
    add_host(store, HostSpec("m2", executor="local", vc="vc-a", telemetry="emulated", gpus=2,
                             workdir=str(tmp_path / "m2")))
    assert estimate(store, wide, fast_config(**NO_PROFILING), time.time()).start is not None
    _cancel_all(store, running, wide)


@pytest.mark.parametrize(("starts", "now", "stalled"), [
    ([1000.0, 1030.0, 1060.0, 1090.0], 1090.0 + 150.0, False),  # five gaps of 30 s: not yet
    ([1000.0, 1030.0, 1060.0, 1090.0], 1090.0 + 151.0, True),
    ([1000.0, 1001.0, 1002.0, 1003.0], 1003.0 + 100.0, False),  # fast rounds: never sooner than the floor
    ([1000.0, 1001.0, 1002.0, 1003.0], 1003.0 + 121.0, True),
    ([1000.0, 1600.0, 2200.0, 2800.0], 2800.0 + 2900.0, False),  # rounds every 10 min: stalled after 50
    ([1000.0], 1000.0 + 121.0, True),  # no cadence to go by: the floor
])
def test_rounds_count_as_stalled_after_five_of_their_gaps_and_never_sooner_than_the_floor(starts, now, stalled):
    from lucid_core.runtime.surfaces.round_age import stalled_words

    words = stalled_words(starts, now)
    assert (words is not None) == stalled, words
    assert stalled_words([], now) == "no scheduling round has run yet: nothing starts until one runs (lucid round)"


def test_a_job_being_profiled_counts_among_those_a_host_removal_would_strand(store, tmp_path):
    """`hosts drain --remove` warned of waiting jobs the VC could no longer hold, but not of one being profiled
    (it next waits for main GPUs just the same)."""
    from sqlalchemy import update

    from lucid_core.runtime.hosts.inventory import stranded_without
    from lucid_core.runtime.store.schema import JobRow
    from lucid_core.runtime.surfaces.submission import JobRequest, submit

    _two_hosts(store, tmp_path)
    profiled, queued, _fits_after = (submit(store, JobRequest("sleep 1", gpus, "ann", "vc-a")) for gpus in (4, 3, 2))
    with store.session() as s:
        s.execute(update(JobRow).where(JobRow.job_id == profiled).values(state="PROFILING"))
        s.execute(update(JobRow).where(JobRow.job_id == queued).values(state="QUEUED"))
    stranded = stranded_without(store, "m0")
    assert stranded is not None and stranded.jobs == [(profiled, 4), (queued, 3)], stranded
