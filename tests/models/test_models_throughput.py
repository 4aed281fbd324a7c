"""Throughput EBM: no look-ahead in features, beats the naive forecast, explains, forecasts online."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from lucid_core.models.datasets import load_throughput_series, shared_data_dir
from lucid_core.models.throughput import ThroughputForecast, ThroughputModel, slot_features
from lucid_core.policy.predictors import ThroughputForecaster

SERIES = shared_data_dir() / "venus" / "cluster_throughput_2020-04_2020-08.csv"


@pytest.fixture(scope="module")
def series():
    if not SERIES.exists():
        pytest.skip(f"Venus series not found at {SERIES} (set LUCID_SHARED_DATA)")
    return load_throughput_series(SERIES).loc["2020-06-01":"2020-07-07"]


@pytest.fixture(scope="module")
def fitted(series):
    train = series.loc[:"2020-06-30"]
    jobs = ThroughputModel("submit_gpu_job", interactions=2, outer_bags=1, max_rounds=150).fit(train["submit_gpu_job"])
    gpus = ThroughputModel("submit_gpu_num", interactions=2, outer_bags=1, max_rounds=150).fit(train["submit_gpu_num"])
    return jobs, gpus


def test_features_never_see_the_slot_they_predict():
    index = pd.date_range("2020-01-01", periods=2000, freq="10min")
    base = pd.Series(np.arange(2000, dtype=float) % 7, index=index)
    changed = base.copy()
    changed.iloc[1500:] += 1000.0  # the future changes
    a, b = slot_features(base), slot_features(changed)
    pd.testing.assert_frame_equal(a.iloc[:1501], b.iloc[:1501])  # row 1500 still sees only slots < 1500
    assert not a.iloc[1501:].equals(b.iloc[1501:])


def test_beats_naive_last_slot_on_held_out_week(series, fitted):
    jobs, _ = fitted
    counts = series["submit_gpu_job"].astype(float)
    X = slot_features(counts)
    test = X.index >= pd.Timestamp("2020-07-01")
    truth = counts[test].to_numpy()
    model_mae = np.abs(truth - jobs.predict_features(X[test])).mean()
    naive_mae = np.abs(truth - X.loc[test, "lag_1"].to_numpy()).mean()
    assert model_mae < naive_mae


def test_contributions_sum_to_prediction(series, fitted):
    jobs, _ = fitted
    X = slot_features(series["submit_gpu_job"]).iloc[-50:]
    explanations = jobs.explain(X)
    raw = jobs.ebm_.predict(X[jobs.feature_names_])
    for e, r in zip(explanations, raw, strict=True):
        assert e.total() == pytest.approx(r, abs=1e-6)
        assert e.prediction == pytest.approx(r, abs=1e-6)
    assert np.expm1(raw) == pytest.approx(jobs.predict_features(X), abs=1e-9)


def test_online_forecaster_matches_batch_predictions(series, fitted):
    jobs, gpus = fitted
    epoch = pd.Timestamp("2020-06-20")
    part = series.loc["2020-06-20":"2020-07-03"]
    forecaster = ThroughputForecast(jobs, gpus, epoch=epoch)
    assert isinstance(forecaster, ThroughputForecaster)
    batch_jobs = pd.Series(jobs.predict(series["submit_gpu_job"]), index=series.index)
    batch_gpus = pd.Series(gpus.predict(series["submit_gpu_num"]), index=series.index)
    checked = 0
    for i, (ts, row) in enumerate(part.iterrows()):
        t = (ts - epoch).total_seconds()
        if i < 3:
            assert forecaster.forecast(t + 1).source.startswith("cold start")
        if i > 1010 and i % 25 == 0:  # a full week of observed history: features equal the batch ones
            f = forecaster.forecast(t + 1)
            assert f.jobs_per_slot == pytest.approx(batch_jobs[ts], abs=1e-9)
            assert f.gpus_per_slot == pytest.approx(batch_gpus[ts], abs=1e-9)
            checked += 1
        n = int(row["submit_gpu_job"])
        for k in range(n):
            forecaster.observe_submission(t + k * 600.0 / (n + 1), int(row["submit_gpu_num"]) if k == 0 else 0)
    assert checked >= 5
