"""What must hold after every fault: one terminal state per job, no job running twice, no GPU double-booked.

Checked from the store (job rows, terminal events, run intervals) and, where the jobs write one,
from a ledger the job processes append to on the hosts themselves (ground truth for "ran twice").
"""

from __future__ import annotations

import itertools
import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path

from sqlalchemy import select

from lucid_core.runtime.store.schema import JobEventRow, JobRow, RunRow
from lucid_core.runtime.store.store import Store

TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")
TERMINAL_EVENTS = ("completed", "failed", "cancelled")


def ledger_command(ledger: Path, body: str) -> str:
    """A job command that records each start of each run (and its end, when it gets there) in `ledger`."""
    return (f'echo "S $LUCID_RUN_ID $LUCID_NODE_RANK $$" >> {ledger}; {body}; rc=$?; '
            f'echo "E $LUCID_RUN_ID $LUCID_NODE_RANK" >> {ledger}; exit $rc')


def ledger_starts(ledger: Path) -> Counter:
    """(run id, node rank) -> how many times a process of it started on a host."""
    if not ledger.exists():
        return Counter()
    return Counter((w[1], w[2]) for w in (line.split() for line in ledger.read_text().splitlines())
                   if len(w) >= 3 and w[0] == "S")


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def check_invariants(store: Store, job_ids: Iterable[str], ledger: Path | None = None,
                     allow_states: tuple[str, ...] = TERMINAL) -> dict[str, str]:
    """Assert the three invariants over `job_ids`; returns job id -> final state."""
    job_ids = list(job_ids)
    with store.session() as s:
        jobs = {j.job_id: j for j in s.scalars(select(JobRow).where(JobRow.job_id.in_(job_ids)))}
        endings = Counter(s.scalars(select(JobEventRow.job_id).where(
            JobEventRow.job_id.in_(job_ids), JobEventRow.kind.in_(TERMINAL_EVENTS))))
        runs = list(s.scalars(select(RunRow)))
    assert sorted(jobs) == sorted(job_ids), "a submitted job is missing from the store"
    for job_id, job in jobs.items():
        assert job.state in allow_states, f"{job_id} ended in {job.state} ({job.end_reason})"
        assert endings[job_id] == 1, f"{job_id} has {endings[job_id]} terminal events, expected exactly 1"
    for run in runs:
        assert run.state not in ("planned", "running"), f"run {run.run_id}@{run.host} is still {run.state}"

    # no job runs twice: the store's run intervals of one job never overlap, each run started once
    intervals: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    per_gpu: dict[tuple[str, int], list[tuple[float, float, RunRow]]] = defaultdict(list)
    for run in runs:
        if run.started_at is None:
            continue
        span = (run.started_at, run.ended_at if run.ended_at is not None else math.inf)
        if run.node_rank == 0:
            intervals[run.job_id].append((*span, run.run_id))
        for index in run.gpu_indices:
            per_gpu[(run.host, index)].append((*span, run))
    for job_id, spans in intervals.items():
        spans.sort()
        for (a0, a1, ra), (b0, b1, rb) in itertools.pairwise(spans):
            assert not _overlap((a0, a1), (b0, b1)), f"{job_id} ran twice at once: {ra} and {rb}"
    if ledger is not None:
        starts = ledger_starts(ledger)
        twice = {key: n for key, n in starts.items() if n > 1}
        assert not twice, f"runs started more than once on a host: {twice}"
        known = {(r.run_id, str(r.node_rank)) for r in runs if r.started_at is not None}
        unknown = set(starts) - known
        assert not unknown, f"processes ran that the store never recorded as started: {unknown}"

    # no GPU double-booked: at most one run per GPU at a time, or two that the binder paired
    for gpu, spans in per_gpu.items():
        for i, (a0, a1, ra) in enumerate(spans):
            sharing = [rb for (b0, b1, rb) in spans[i + 1:] if _overlap((a0, a1), (b0, b1))]
            for rb in sharing:
                paired = ra.partner == rb.job_id or rb.partner == ra.job_id
                assert paired, f"GPU {gpu} double-booked by {ra.run_id} and {rb.run_id} (not a sharing pair)"
            assert len(sharing) <= 1, f"GPU {gpu} held by more than two runs at once"
    return {job_id: job.state for job_id, job in jobs.items()}
