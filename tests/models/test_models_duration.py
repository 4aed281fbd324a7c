"""Duration EBM: no leakage, beats the history fallback, explanations add up, monotone in GPUs,
saved-then-loaded predicts identically, serves the DurationPredictor protocol online."""

from __future__ import annotations

import numpy as np
import pytest

from lucid_core.domain import Job, Profile
from lucid_core.models.duration import DurationModel, score_log
from lucid_core.models.monotone import is_monotone
from lucid_core.models.registry import ModelRegistry
from lucid_core.models.synthetic import synthetic_job_log
from lucid_core.policy.predictors import DurationPredictor

FAST = {"interactions": 3, "outer_bags": 1, "max_rounds": 300}


@pytest.fixture(scope="module")
def log():
    return synthetic_job_log(4000, n_users=20, days=14, seed=1)


@pytest.fixture(scope="module")
def split(log):
    test = (log["submit_time"] >= log["submit_time"].quantile(0.8)).to_numpy()
    return test


@pytest.fixture(scope="module")
def fitted(log, split):
    model = DurationModel(**FAST)
    X = model.prepare(log, name_source=log[~split])
    y = np.log1p(log["duration"].to_numpy())
    model.fit_design(X[~split], y[~split])
    return model, X, y


def test_history_features_ignore_the_jobs_own_and_future_durations(log):
    model = DurationModel(**FAST)
    X = model.prepare(log)
    changed = log.copy()
    changed.loc[changed.index[1000:], "duration"] *= 50.0  # jobs from 1000 on change
    Y = model.prepare(changed)
    ends = (log["submit_time"] + log["duration"]).to_numpy()
    # a job's features may only move if some changed job had ended before it was submitted
    first_changed_end = ends[1000:].min()
    unaffected = (log["submit_time"].to_numpy() < first_changed_end)
    assert unaffected[1000]  # the changed jobs' own rows are among the unaffected ones
    cols = list(X.select_dtypes("number").columns)
    np.testing.assert_array_equal(X.loc[unaffected, cols].to_numpy(), Y.loc[unaffected, cols].to_numpy())
    assert "job_id" not in X.columns


def test_beats_fallback_and_global_mean_on_held_out_jobs(fitted, split):
    model, X, y = fitted
    ebm = score_log(y[split], model.predict_log(X[split]))
    fallback = score_log(y[split], X.loc[split, "history_estimate"].to_numpy())
    assert ebm.mae_log < fallback.mae_log
    assert ebm.r2 > fallback.r2
    assert ebm.r2 > 0.0  # better than the training mean


def test_contributions_sum_to_prediction(fitted):
    model, X, _ = fitted
    rows = X.iloc[:40]
    raw = model.ebm_.predict(rows[model.feature_names_])
    for e, r in zip(model.explain(rows), raw, strict=True):
        assert e.intercept + sum(e.contributions.values()) == pytest.approx(r, abs=1e-6)
    assert "vc" in model.explain(rows.iloc[:1])[0].contributions


def test_monotone_constraint_in_gpu_demand(log, split):
    model = DurationModel(monotone_gpus=True, **FAST)
    X = model.prepare(log, name_source=log[~split])
    model.fit_design(X[~split], np.log1p(log["duration"].to_numpy())[~split])
    index = model.ebm_.term_names_.index("gpus")
    assert is_monotone(model.ebm_.term_scores_[index][1:-1])
    gpus_feature = model.feature_names_.index("gpus")
    pairs = [f for f in model.ebm_.term_features_ if len(f) > 1]
    assert pairs and all(gpus_feature not in f for f in pairs)  # no interaction can bend the shape back
    for i in range(0, 200, 40):
        grid = X.iloc[[i] * 6].copy()
        grid["gpus"] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0]
        assert is_monotone(model.ebm_.predict(grid[model.feature_names_]))


def test_online_protocol_cold_start_and_round_trip(tmp_path, fitted, log):
    model, _, _ = fitted
    assert isinstance(model, DurationPredictor)
    last = float(log["submit_time"].max())
    known = Job("j1", user="user001", vc="vc1", gpus=1, submit_time=last + 60, name="001-resnet50-cifar_lr0.001_s3")
    stranger = Job("j2", user="nobody", vc="vc9", gpus=4, submit_time=last + 60, name="brand-new")
    preds = model.predict_duration([known, stranger])
    assert all(p > 0 for p in preds)
    assert preds[1] == pytest.approx(model.fallback_.predict_one(stranger)[0])  # cold start: the fallback
    outlived = Job("j3", user="user001", vc="vc1", gpus=1, submit_time=last + 60, known_min_duration=1e6)
    assert model.predict_duration([outlived])[0] >= 1e6

    registry = ModelRegistry(tmp_path / "registry")
    meta = registry.register("duration", model, kind="duration_ebm", training_window=("a", "b"),
                             data_hash="x", metrics={"r2": 0.5})
    registry.promote("duration", meta.version)
    loaded = registry.load("duration")
    assert loaded.predict_duration([known, stranger]) == preds

    n_before = model.history_.user_count["nobody"]
    model.observe(stranger, 1234.0)
    assert model.history_.user_count["nobody"] == n_before + 1


def test_history_rows_are_reused_until_the_history_changes(fitted, log):
    """A round predicts many jobs of one user, name and size: their history features are read once and
    reused (`history_rows_`) until a job ends; the predictions equal those made with the cache empty."""
    import copy

    model = copy.deepcopy(fitted[0])
    last = float(log["submit_time"].max())
    jobs = [Job(f"q{i}", user=f"user00{i % 3}", vc="vc1", gpus=1 + i % 2, submit_time=last + 60 + i,
                name="001-resnet50-cifar_lr0.001_s3") for i in range(12)]
    first = model.predict_duration(jobs)
    assert len(model.history_rows_) == 6  # 3 users x 2 sizes, one name
    model.history_rows_ = {}
    assert model.predict_duration(jobs) == first
    model.observe(Job("done", user="user000", vc="vc1", gpus=1, submit_time=last, name="001-resnet50-cifar",
                      end_time=last + 120), 90000.0)
    assert model.history_rows_ == {}  # a job ended: every user's overall mean moved
    after = model.predict_duration(jobs)
    model.history_rows_ = {}
    assert model.predict_duration(jobs) == after
    assert after[0] != first[0]  # user000's own history changed its prediction


def test_online_history_features_equal_the_offline_replay(log):
    """Fed by observe() in end order after warm_history, the live features are the training ones."""
    import heapq

    part = log.head(1500)
    model = DurationModel(condition_on_s=200.0, **FAST)
    X = model.prepare(part)
    start = float(part["submit_time"].iloc[1000])
    model.warm_history(part, until=start)
    later = part[part["submit_time"] >= start]
    ends = [(r.submit_time + r.duration, i, r) for i, r in enumerate(later.itertuples())]
    heapq.heapify(ends)
    numeric = [c for c in X.columns if c not in ("vc", "user", "name_bucket")]
    for r in later.itertuples():
        while ends and ends[0][0] <= r.submit_time:
            end, _, done = heapq.heappop(ends)
            job = Job(done.job_id, user=done.user, vc=done.vc, gpus=int(done.gpus), submit_time=done.submit_time,
                      name=done.name)
            job.end_time = end
            model.observe(job, done.duration)
        job = Job(r.job_id, user=r.user, vc=r.vc, gpus=int(r.gpus), submit_time=r.submit_time, name=r.name,
                  profile=Profile(r.gpu_util, r.mem_util, r.gpu_mem_mb))
        live = model.features_of([job])
        offline = X.loc[r.Index, numeric].to_numpy(dtype=float)
        np.testing.assert_allclose(live[numeric].to_numpy(dtype=float)[0], offline, rtol=1e-9, atol=1e-9)
        assert live["name_bucket"].iloc[0] == X.loc[r.Index, "name_bucket"]


@pytest.mark.parametrize("epoch", ["2017-09-30 17:12:00", "2024-03-10 01:30:00-05:00"])
def test_calendar_features_match_pandas_on_naive_and_zoned_clocks(epoch):
    """Hour (to the minute) and weekday come from numpy on a naive clock; they must equal pandas'."""
    import pandas as pd

    model = DurationModel()
    model.epoch_ = pd.Timestamp(epoch)
    rng = np.random.default_rng(0)
    seconds = np.concatenate([rng.uniform(-1e7, 1e8, 20000), np.arange(0, 3 * 86400, 59.9999999),
                              np.arange(0, 86400, 60.0) - 1e-9])
    hour, weekday = model._calendar(seconds)
    at = model.epoch_ + pd.to_timedelta(seconds, unit="s")
    assert np.array_equal(hour, at.hour.to_numpy() + at.minute.to_numpy() / 60.0)
    assert np.array_equal(weekday, at.day_of_week.to_numpy().astype(float))


def test_live_rows_equal_the_training_replay_rows(log):
    """features_of (a round's few jobs, built from arrays) and prepare (training) agree column for column."""
    import pandas as pd

    model = DurationModel(**FAST)
    train = log.iloc[:3000]
    model.prepare(train)
    later = log.iloc[3000:3040]
    jobs = [Job(str(r.job_id), str(r.user), str(r.vc), int(r.gpus), float(r.submit_time), name=str(r.name))
            for r in later.itertuples()]
    live = model.features_of(jobs)
    again = DurationModel(**FAST)
    replayed = again.prepare(pd.concat([train, later]))
    assert list(live.columns) == list(replayed.columns)
    for column in ("vc", "gpus", "hour", "day_of_week"):
        assert list(live[column]) == list(replayed[column].iloc[3000:3040]), column


def test_the_round_notes_a_batch_of_predictions_in_words(fitted, log):
    """What the round records for explain: the prediction rounded, by which model, its largest terms."""
    from lucid_core.runtime.round.prediction_words import prediction_notes

    model, _, _ = fitted
    last = float(log["submit_time"].max())
    jobs = [Job(f"j{k}", user="user001", vc="vc1", gpus=1 + k % 2, submit_time=last + 60, name="x-resnet") for k in
            range(5)]
    for job, predicted in zip(jobs, model.predict_duration(jobs), strict=True):
        job.predicted_duration = predicted
    notes = prediction_notes(model, jobs)
    assert set(notes) == {j.job_id for j in jobs}
    for note in notes.values():
        assert note.startswith("predicted ") and "by DurationModel; largest terms " in note
        assert note.count(",") == 2 and "e+" not in note  # three terms, numbers rounded


def test_scores_read_from_the_ebm_tables_equal_its_own_predict(fitted):
    """score_ebm (the live path, no input checks) gives the EBM's own predictions bit for bit: on held-out
    rows, on values that sit exactly on cut points, missing values, unseen categories, one row, and on the
    design's columns given as arrays; and it declines what it does not cover."""
    import pandas as pd

    from lucid_core.models.ebm_scoring import score_ebm

    model, X, _ = fitted
    ebm = model.ebm_
    rows = X[model.feature_names_].iloc[:600].copy()
    rng = np.random.default_rng(3)
    for f, name in enumerate(ebm.feature_names_in_):
        table = ebm.bins_[f][-1]
        if isinstance(table, dict):
            rows.loc[rows.index[:30], name] = "never-seen"
            rows.loc[rows.index[30:40], name] = pd.NA
        else:
            cuts = np.asarray(table)
            if len(cuts):
                rows.loc[rows.index[100:200], name] = cuts[rng.integers(0, len(cuts), 100)]
                rows.loc[rows.index[200:210], name] = cuts[0] - 1e6
            rows.loc[rows.index[210:220], name] = np.nan
    for frame in (X[model.feature_names_], rows, rows.iloc[:16], rows.iloc[:1]):
        assert np.array_equal(score_ebm(ebm, frame), np.asarray(ebm.predict(frame), dtype=float))
    small = rows.iloc[:16]
    columns = {c: small[c].to_numpy(dtype=object if small[c].dtype != float else float) for c in small.columns}
    assert np.array_equal(score_ebm(ebm, columns), np.asarray(ebm.predict(small), dtype=float))
    assert score_ebm(ebm, {c: small[c] for c in small.columns if c != "gpus"}) is None  # a column missing
    numeric = {**{c: small[c] for c in small.columns}, "vc": np.arange(16)}
    assert score_ebm(ebm, numeric) is None  # a nominal column that is not text: left to interpret
