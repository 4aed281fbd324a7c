"""The history fallback's batch fit learns exactly what learning each job in turn does (a live round refits
it on up to 50,000 finished jobs, so the fit groups first; the simulator and the round must agree)."""

from __future__ import annotations

import math
from collections import namedtuple

import numpy as np

from lucid_core.domain import Job
from lucid_core.policy.predictors import HistoryDurationPredictor

Row = namedtuple("Row", ["user", "gpus"])  # a history row as the round reads it: no Job built


def _one_by_one(jobs, durations, model: HistoryDurationPredictor) -> HistoryDurationPredictor:
    for job, duration in zip(jobs, durations, strict=True):
        model._add(job, duration)
    model._refresh()
    return model


def _state(model: HistoryDurationPredictor) -> tuple[dict, dict]:
    tables = {k: (t._sorted, t._suffix, t._pending) for k, t in model.tables_.items()}
    return tables, {k: list(v) for k, v in model.recent_.items()}


def test_batch_fit_equals_learning_each_job_in_turn():
    rng = np.random.default_rng(3)
    users, gpus = rng.integers(0, 7, 3000), rng.choice([1, 2, 4, 8], 3000)
    durations = [float(d) for d in rng.lognormal(7, 2, 3000)]
    durations[:5] = [0.0, -3.0, float("nan"), 0.0, 1e9]  # clamped alike: zero, negative, NaN, huge
    rows = [Row(f"u{u}", int(g)) for u, g in zip(users, gpus, strict=True)]
    jobs = [Job(job_id=f"j{i}", user=r.user, vc="a", gpus=r.gpus, submit_time=0.0) for i, r in enumerate(rows)]
    batch = HistoryDurationPredictor().fit(rows, durations)
    assert _state(batch) == _state(_one_by_one(jobs, durations, HistoryDurationPredictor()))
    # a second fit on a model that already holds jobs adds to them, as more `_add`s would
    again = batch.fit(rows[:400], durations[:400])
    reference = _one_by_one(jobs[:400], durations[:400], _one_by_one(jobs, durations, HistoryDurationPredictor()))
    assert _state(again) == _state(reference)
    probe = [Job(job_id=f"p{u}", user=f"u{u}", vc="a", gpus=g, submit_time=0.0, known_min_duration=k)
             for u in range(8) for g in (1, 8) for k in (0.0, 600.0)]
    assert again.predict_duration(probe) == reference.predict_duration(probe)
    assert len({round(p) for p in again.predict_duration(probe)}) > 4  # the probes really differ


def test_recent_window_keeps_the_last_jobs_in_the_order_learned_across_gpu_demands():
    rows = [Row("ann", 1 if i % 3 else 8) for i in range(70)]
    durations = [float(100 + i) for i in range(70)]
    model = HistoryDurationPredictor(recent=30).fit(rows, durations)
    assert list(model.recent_[("user", "ann")]) == durations[-30:]
    assert list(model.recent_[("user-gpus", "ann", 8)]) == [d for r, d in zip(rows, durations, strict=True)
                                                           if r.gpus == 8][-30:]


def test_a_tables_suffix_sums_are_the_logs_summed_from_the_end():
    """The conditional mean reads suffix sums: each must be log1p of the sorted durations added from the
    last one down, in that order (the order the predictions of every earlier version were made with)."""
    rng = np.random.default_rng(4)
    model = HistoryDurationPredictor().fit([Row("ann", 1)] * 500, [float(d) for d in rng.lognormal(6, 2, 500)])
    table = model.tables_[("user-gpus", "ann", 1)]
    expected = [0.0] * (len(table._sorted) + 1)
    for i in range(len(table._sorted) - 1, -1, -1):
        expected[i] = expected[i + 1] + math.log1p(table._sorted[i])
    assert table._sorted == sorted(table._sorted) and table._suffix == expected
    n, mean = table.conditional(table._sorted[250])
    assert n == 249 and mean == expected[251] / 249
