"""Live-scheduler figures: policy decision time and whole-round overhead (no SSH latency).

1. Decision time: LucidPolicy on a 1,000-GPU cluster (125 x 8-GPU nodes, most GPUs busy) with
   2,048 and 20,000 pending profiled jobs, models included: the packing tree labels each
   profile (on_profiled) and the GA2M duration model predicts every pending job in one batch
   (schedule). Timed: a cold round (every job new to the policy) and a warm round (queue
   already predicted, 16 new jobs), median of repeats.
2. Round overhead: SchedulingRound.run() against a SQLite store holding the same cluster as
   125 hosts and N queued jobs, with an executor that answers at once (so no SSH latency):
   reads, view rebuild, policy, writes of decisions and job fields.

    .venv/bin/python benchmarks/bench_round.py [--quick] [--out benchmarks/results/runtime.md]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lucid_core.config import LucidConfig
from lucid_core.domain import GpuRef, Job, Pool, Profile
from lucid_core.policy.lucid import LucidPolicy
from lucid_core.policy.predictors import HistoryDurationPredictor
from lucid_core.policy.view import ClusterView
from lucid_core.runtime.hosts.executor import LaunchResult, RunStatus

NODES, GPUS_PER_NODE = 125, 8


def trained_models(seed: int = 0) -> tuple[object, object, str]:
    """The interpretable models the live round would load: duration GA2M and packing tree."""
    from lucid_core.models.duration import DurationModel
    from lucid_core.models.synthetic import synthetic_job_log

    log = synthetic_job_log(4000, n_users=40, days=14, seed=seed)
    duration = DurationModel(interactions=3, outer_bags=1, max_rounds=300, n_jobs=1).fit(log)
    note = "duration: EBM (GA2M) fitted on a 4,000-job synthetic log"
    try:
        from lucid_core.models.datasets import shared_data_dir
        from lucid_core.models.packing import PackingTree, load_packing_catalog

        packing = PackingTree().fit_catalog(load_packing_catalog(shared_data_dir() / "lucid_artifact"))
        note += "; packing: pruned decision tree fitted on the Lucid artifact catalog"
    except (OSError, ValueError) as exc:
        from lucid_core.policy.predictors import UtilizationRuleClassifier

        packing = UtilizationRuleClassifier()
        note += f"; packing: utilization rule (artifact catalog unavailable: {exc})"
    return duration, packing, note


def _profile(rng: np.random.Generator) -> Profile:
    util = float(np.clip(rng.normal(55, 28), 1, 100))
    return Profile(util, float(np.clip(util * rng.uniform(0.2, 0.8), 0, 100)),
                   float(rng.uniform(800, 20000)), bool(rng.random() < 0.3))


def _jobs(n: int, rng: np.random.Generator, now: float, prefix: str) -> list[Job]:
    gpus = rng.choice([1, 1, 1, 1, 1, 2, 2, 4, 8, 16], size=n)
    users = rng.integers(0, 40, size=n)
    return [Job(job_id=f"{prefix}{i:06d}", user=f"user{u:03d}", vc=f"vc{u % 4}", gpus=int(g),
                submit_time=now - float(rng.uniform(0, 7200)), name=f"proj{u % 12}-run{i % 7}",
                profile=_profile(rng), known_min_duration=200.0)
            for i, (g, u) in enumerate(zip(gpus, users, strict=True))]


def busy_view(config: LucidConfig, policy: LucidPolicy, rng: np.random.Generator, now: float,
              busy_fraction: float = 0.97) -> ClusterView:
    """125 nodes with `busy_fraction` of the GPUs running exclusive profiled jobs."""
    view = ClusterView(config, now=now)
    view.add_nodes(Pool.MAIN, NODES)
    view.add_nodes(Pool.PROFILING, 2)
    names = list(view.main.nodes)
    busy = int(NODES * GPUS_PER_NODE * busy_fraction)
    k = 0
    for name in names:
        for idx in range(GPUS_PER_NODE):
            if k >= busy:
                break
            job = Job(job_id=f"run{k:05d}", user="user000", vc="vc0", gpus=1, submit_time=now - 9000,
                      profile=_profile(rng), predicted_duration=float(rng.uniform(600, 36000)))
            job.share_class = policy.binder.classify(job.profile)
            view.add_job(job)
            view.now = now - float(rng.uniform(0, 3000))
            view.start(job.job_id, Pool.MAIN, (GpuRef(name, idx),))
            view.set_profile_mem(job.job_id, job.profile.gpu_mem_mb)
            k += 1
    view.now = now
    view.last_mode_check = now  # the mode check runs on its own cadence, not in every round
    return view


def decision_time(n_pending: int, duration: object, packing: object, repeats: int,
                  sharing: bool = True) -> dict[str, float]:
    config = LucidConfig()
    cold, warm, classify, infer = [], [], [], []
    placed = 0
    for r in range(repeats):
        rng = np.random.default_rng(100 + r)
        now = 1_700_000_000.0
        policy = LucidPolicy(config, duration_model=duration, packing_model=packing)
        view = busy_view(config, policy, rng, now)
        if not sharing:
            from lucid_core.domain import SharingMode

            view.sharing_mode = SharingMode.OFF
        pending = _jobs(n_pending, rng, now, "q")
        ti = time.perf_counter()
        duration.predict_duration(pending)  # the batch the policy makes, timed alone
        infer.append((time.perf_counter() - ti) * 1000)
        t0 = time.perf_counter()
        for job in pending:
            view.add_job(job)
            policy.on_profiled(view, job, job.profile)
        t1 = time.perf_counter()
        decisions = policy.schedule(view)
        t2 = time.perf_counter()
        placed = sum(1 for d in decisions if type(d).__name__ == "Place")
        classify.append((t1 - t0) * 1000)
        cold.append((t2 - t0) * 1000)
        fresh = _jobs(16, rng, now, "n")
        t3 = time.perf_counter()
        for job in fresh:
            view.add_job(job)
            policy.on_profiled(view, job, job.profile)
        view.now = now + 1
        policy.schedule(view)
        warm.append((time.perf_counter() - t3) * 1000)
    return {"cold_ms": statistics.median(cold), "classify_ms": statistics.median(classify),
            "infer_ms": statistics.median(infer),
            "warm_ms": statistics.median(warm), "placed": placed}


class InstantExecutor:
    """Executor stand-in that answers at once: every launch succeeds, every run keeps running."""

    def launch(self, host: object, spec: object) -> LaunchResult:
        return LaunchResult(pid=4242, already_launched=False)

    def poll(self, host: object, run_ids: Sequence[str]) -> dict[str, RunStatus]:
        return {r: RunStatus("RUNNING", pid=4242) for r in run_ids}

    def probe(self, host: object) -> None:
        """Every host answers."""

    def stop(self, host: object, run_id: str, reason: str, grace_s: float) -> RunStatus:
        return RunStatus("EXITED", exit_code=143, stop_requested=True)

    def read(self, host: object, run_id: str, name: str, max_bytes: int = 1 << 20) -> str:
        return ""

    def read_front_lines(self, host: object, run_id: str, name: str, max_bytes: int, line_bytes: int,
                         scan_bytes: int) -> str:
        """The profile window's read: these emulated files hold only well-formed lines."""
        return self.read(host, run_id, name, max_bytes)

    def close(self) -> None:
        """Nothing to close."""


def _fleet_store(path: str, n_pending: int, rng: np.random.Generator, now: float) -> Any:
    """A SQLite store holding the benchmark cluster as 125 hosts (and 2 profiling hosts) and `n_pending`
    queued, profiled jobs."""
    from lucid_core.runtime.hosts.inventory import HostSpec, add_host
    from lucid_core.runtime.store.schema import JobRow
    from lucid_core.runtime.store.store import Store

    store = Store(f"sqlite:///{path}")
    for i in range(NODES):
        add_host(store, HostSpec(f"node{i:03d}", executor="local", vc=f"vc{i % 4}", gpus=GPUS_PER_NODE))
    for i in range(2):
        add_host(store, HostSpec(f"prof{i}", executor="local", pool="profiling", vc="vc0", gpus=GPUS_PER_NODE))
    with store.session() as s:
        for i, job in enumerate(_jobs(n_pending, rng, now, "j")):
            p = job.profile
            s.add(JobRow(job_id=job.job_id, seq=i + 1, name=job.name, user=job.user, vc=job.vc, gpus=job.gpus,
                         command="sleep 1", env={}, state="QUEUED", submit_time=job.submit_time, profiled=True,
                         gpu_util=p.gpu_util, mem_util=p.mem_util, gpu_mem_mb=p.gpu_mem_mb,
                         known_min_duration=200.0, amp=p.amp))
    return store


def round_overhead(n_pending: int, duration: object, packing: object, repeats: int) -> dict[str, float]:
    from lucid_core.runtime.round.live_models import ReplayForecaster
    from lucid_core.runtime.round.scheduling_round import RoundSettings, SchedulingRound

    config = LucidConfig()
    rng = np.random.default_rng(7)
    now = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        store = _fleet_store(f"{tmp}/bench.db", n_pending, rng, now)
        store.set_state("last_mode_check", now + 1e9)  # keep the sharing-mode check out of the timing

        def factory(cfg: LucidConfig, snapshot: object) -> LucidPolicy:
            from lucid_core.policy.predictors import RecentSlotsForecaster

            policy = LucidPolicy(cfg, duration_model=duration, packing_model=packing,
                                 forecaster=ReplayForecaster(RecentSlotsForecaster()))
            # named models, as the live default names its own: a steady round restores what it predicted
            policy.model_sources = {"duration": "bench duration model", "packing": "bench packing model"}
            return policy

        totals, decides, counts = [], [], []
        for r in range(repeats):
            settings = RoundSettings(holder=f"bench-{r}")
            report = SchedulingRound(store, InstantExecutor(), config, settings,  # type: ignore[arg-type]
                                     policy_factory=factory).run()
            totals.append(report.total_ms)
            decides.append(report.decide_ms)
            counts.append(len(report.decisions))
        store.dispose()
    return {"first_round_ms": totals[0], "first_decisions": counts[0],
            "steady_round_ms": statistics.median(totals[1:]) if len(totals) > 1 else totals[0],
            "steady_decide_ms": statistics.median(decides[1:]) if len(decides) > 1 else decides[0]}


def round_with_history(n_pending: int, n_finished: int, since_promotion: int, duration: object, packing: object,
                       repeats: int) -> dict[str, float]:
    """Steady rounds as a live store runs them: `n_finished` finished jobs in its history, the duration
    and packing models promoted (joblib artifacts in `model_versions`, loaded by the round itself), and
    `since_promotion` of the finished jobs ended after the promotion (the round's model learns them).
    One more job finishes between rounds, as in a busy fleet; nothing else changes."""
    import joblib

    from lucid_core.runtime.store.schema import JobRow, ModelVersionRow

    config = LucidConfig()
    rng = np.random.default_rng(11)
    now = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        store = _fleet_store(f"{tmp}/bench.db", n_pending, rng, now)
        promoted_at = now - 3600.0
        ends = np.sort(np.concatenate([rng.uniform(promoted_at - 7 * 86400, promoted_at, n_finished - since_promotion),
                                       rng.uniform(promoted_at, now - 60, since_promotion)]))
        with store.session() as s:
            for i, (job, end) in enumerate(zip(_jobs(n_finished, rng, now, "h"), ends, strict=True)):
                p, run = job.profile, float(rng.lognormal(7.5, 1.5))
                s.add(JobRow(job_id=job.job_id, seq=n_pending + i + 1, name=job.name, user=job.user, vc=job.vc,
                             gpus=job.gpus, command="sleep 1", env={}, state="COMPLETED",
                             submit_time=float(end) - run - 300.0, start_time=float(end) - run, end_time=float(end),
                             profiled=True, gpu_util=p.gpu_util, mem_util=p.mem_util, gpu_mem_mb=p.gpu_mem_mb,
                             known_min_duration=200.0, amp=p.amp))
            for kind, model in (("duration", duration), ("packing", packing)):
                path = f"{tmp}/{kind}.joblib"
                joblib.dump(model, path)
                s.add(ModelVersionRow(kind=kind, version="bench", path=path, created_at=promoted_at, active=True))
        store.set_state("last_mode_check", now + 1e9)  # keep the sharing-mode check out of the timing
        counting = _count_predictions(type(duration))
        try:
            totals, decides, asked = _history_rounds(store, config, repeats, n_pending + n_finished, now, counting)
        finally:  # the class stays patched otherwise, and the store open
            _count_predictions(type(duration), stop=True)
            store.dispose()
    return {"first_round_ms": totals[0], "steady_round_ms": statistics.median(totals[1:]),
            "steady_decide_ms": statistics.median(decides[1:]), "steady_predicted": max(asked[1:])}


def _history_rounds(store: Any, config: LucidConfig, repeats: int, last_seq: int, now: float,
                    counting: list[int]) -> tuple[list[float], list[float], list[int]]:
    """Section (3)'s rounds: total ms, policy ms and jobs predicted, per round."""
    from lucid_core.runtime.round.scheduling_round import RoundSettings, SchedulingRound
    from lucid_core.runtime.store.schema import JobRow

    totals, decides, asked = [], [], []
    for r in range(repeats):
        if r:  # one more job ends between rounds: the history moves, as it does every minute in a fleet
            with store.session() as s:
                s.add(JobRow(job_id=f"end{r}", seq=last_seq + r, name="proj1-run1", user="user001", vc="vc1", gpus=1,
                             command="true", env={}, state="COMPLETED", submit_time=now - 900, start_time=now - 600,
                             end_time=now - 60 + r, profiled=False))
        counting.clear()
        report = SchedulingRound(store, InstantExecutor(), config,  # type: ignore[arg-type]
                                 RoundSettings(holder=f"bench-h{r}")).run()
        totals.append(report.total_ms)
        decides.append(report.decide_ms)
        asked.append(sum(counting))
    return totals, decides, asked


_COUNTED: list[int] = []


def _count_predictions(model_class: type, stop: bool = False) -> list[int]:
    """Counts the jobs each round's duration model predicts (the promoted model is loaded afresh by every
    round, so its class is wrapped; `stop` unwraps it)."""
    original = model_class.predict_duration  # type: ignore[attr-defined]
    inner = getattr(original, "__wrapped__", original)
    if stop:
        if "predict_duration" in model_class.__dict__ and original is not inner:
            model_class.predict_duration = inner  # type: ignore[attr-defined]
        return _COUNTED

    def counted(self: object, jobs: Sequence[Job]) -> list[float]:
        _COUNTED.append(len(jobs))
        return inner(self, jobs)

    counted.__wrapped__ = inner  # type: ignore[attr-defined]
    model_class.predict_duration = counted  # type: ignore[attr-defined]
    return _COUNTED


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, history model instead of the EBM")
    parser.add_argument("--out", default=None, help="write the markdown table here")
    args = parser.parse_args()
    repeats = 2 if args.quick else 5
    if args.quick:
        duration, packing, note = HistoryDurationPredictor(), None, "quick: history duration predictor, rule packing"
        from lucid_core.policy.predictors import UtilizationRuleClassifier

        packing = UtilizationRuleClassifier()
    else:
        t = time.perf_counter()
        duration, packing, note = trained_models()
        note += f" (training {time.perf_counter() - t:.0f} s, not timed below)"
    rows = []
    for n in (2048, 20000):
        d = decision_time(n, duration, packing, repeats)
        o = round_overhead(n, duration, packing, 3 if args.quick else 4)
        rows.append((f"{n:,}", d, o))
        print(n, d, o, flush=True)
    off = {n: decision_time(n, duration, packing, repeats, sharing=False) for n in (2048, 20000)}
    print("sharing off", off, flush=True)
    finished, since = (5000, 500) if args.quick else (50000, 2000)
    lived = round_with_history(20000, finished, since, duration, packing, 3 if args.quick else 5)
    print("with history", lived, flush=True)
    lines = [
        "# Live scheduler: decision time and round overhead",
        "",
        f"Machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}; "
        f"1,000 GPUs (125 x 8), 97% busy in (1). Models: {note}.",
        "Command: `.venv/bin/python benchmarks/bench_round.py" + (" --quick" if args.quick else "") + "`",
        "",
        "| pending jobs | (1) cold decision ms: classify all + predict all + place | of which classify ms "
        "| duration inference alone ms "
        "| (1) warm decision ms: 16 new jobs | jobs placed | (2) first round ms (decisions) "
        "| (2) steady round ms | (2) of which policy ms |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n, d, o in rows:
        lines.append(f"| {n} | {d['cold_ms']:.1f} | {d['classify_ms']:.1f} | {d['infer_ms']:.1f} "
                     f"| {d['warm_ms']:.2f} | {d['placed']} "
                     f"| {o['first_round_ms']:.0f} ({o['first_decisions']}) | {o['steady_round_ms']:.0f} "
                     f"| {o['steady_decide_ms']:.0f} |")
    lines += ["", "Same decision with sharing off (exclusive placement only; column (1) as above):", "",
              "| pending jobs | cold decision ms | of which classify ms | duration inference alone ms "
              "| warm decision ms | jobs placed |", "|---:|---:|---:|---:|---:|---:|"]
    for n, d in off.items():
        lines.append(f"| {n:,} | {d['cold_ms']:.1f} | {d['classify_ms']:.1f} | {d['infer_ms']:.1f} "
                     f"| {d['warm_ms']:.2f} | {d['placed']} |")
    lines += ["", f"(3) A store as a live fleet has it: 20,000 queued, {finished:,} finished jobs in its history, the "
              f"models promoted as artifacts the round loads, {since:,} jobs ended since the promotion, one more "
              "job ending between rounds:", "",
              "| queued | finished | first round ms | steady round ms | of which policy ms | jobs re-predicted per "
              "steady round |", "|---:|---:|---:|---:|---:|---:|",
              f"| 20,000 | {finished:,} | {lived['first_round_ms']:.0f} | {lived['steady_round_ms']:.0f} "
              f"| {lived['steady_decide_ms']:.0f} | {lived['steady_predicted']:.0f} |"]
    lines += [
        "", "Paper: < 3 ms per decision with 2,048 queued jobs, model inference included.", "",
        "Notes:",
        "- (1) cold: every pending job is new to the policy (one `on_profiled` each, then one `schedule`"
        " that predicts all of them in a batch and scans the queue); warm: the queue was predicted by an"
        " earlier round and 16 jobs arrived (the steady state of a live scheduler).",
        "- With sharing on and 30 free GPUs, most placements are pairs on running jobs: the partner search"
        " per queued job is what the cold decision spends beyond inference.",
        "- (2) runs `SchedulingRound.run()` on a SQLite store with an executor that answers at once: store"
        " reads, view rebuild through the policy hooks (a queued job classified and predicted by an earlier"
        " round with the same models is restored, not predicted again: `jobs.predicted_by`),"
        " the policy, and the writes. The first round launches its decisions; later rounds find the cluster"
        " full.",
        "- Medians of repeated runs on a machine shared with other work; repeated runs vary by tens of"
        " percent.", ""]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
