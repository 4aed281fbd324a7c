"""Throughput Predict Model: a GA2M (EBM) forecasting next-slot GPU-job submissions and GPUs.

Features of slot t use only slots before t: calendar parts of t itself, lags, rolling means and
medians, and exponentially weighted soft sums of the past. The same feature function serves
training (a whole series) and the online forecaster (the recent slots it has observed).
"""

from __future__ import annotations

import math
import time as _time
from dataclasses import dataclass

import numpy as np
import pandas as pd

from lucid_core.policy.predictors import Forecast, RecentSlotsForecaster

SLOT_S = 600.0
SLOTS_PER_DAY = 144
LAGS = (1, 2, 3, 6, SLOTS_PER_DAY, 7 * SLOTS_PER_DAY)
MEAN_WINDOWS = (3, 6, 18, 36, SLOTS_PER_DAY)
MEDIAN_WINDOWS = (6, 36, SLOTS_PER_DAY)
SOFT_HALF_LIVES = (1, 3, 12, 72)
HISTORY_SLOTS = 7 * SLOTS_PER_DAY + 1  # the longest lag needs a week of past slots
TARGETS = ("submit_gpu_job", "submit_gpu_num")


def slot_features(counts: pd.Series) -> pd.DataFrame:
    """Features for every slot of a regular 10-minute series; row t sees counts[:t] only."""
    idx = pd.DatetimeIndex(counts.index)
    past = counts.astype(float).shift(1)  # the newest value a forecast for slot t may use
    cols: dict[str, np.ndarray] = {
        "hour": idx.hour.to_numpy() + idx.minute.to_numpy() / 60.0,
        "day_of_week": idx.day_of_week.to_numpy(),
        "month": idx.month.to_numpy(),
    }
    for lag in LAGS:
        cols[f"lag_{lag}"] = counts.astype(float).shift(lag).to_numpy()
    for w in MEAN_WINDOWS:
        cols[f"mean_{w}"] = past.rolling(w, min_periods=1).mean().to_numpy()
    for w in MEDIAN_WINDOWS:
        cols[f"median_{w}"] = past.rolling(w, min_periods=1).median().to_numpy()
    for h in SOFT_HALF_LIVES:
        cols[f"soft_sum_h{h}"] = soft_sum(past.to_numpy(), h)
    return pd.DataFrame(cols, index=counts.index)


def soft_sum(past: np.ndarray, half_life: float) -> np.ndarray:
    """Exponentially weighted sum of the values before each slot over a finite window (6 half-lives).

    `past` is already shifted (entry t is the value of slot t-1); missing slots count as zero,
    and an all-missing window gives NaN.
    """
    window = int(6 * half_life)
    weights = 0.5 ** (np.arange(window) / half_life)
    values = np.nan_to_num(past, nan=0.0)
    known = (~np.isnan(past)).astype(float)
    total = np.convolve(values, weights)[: len(past)]
    seen = np.convolve(known, np.ones(window))[: len(past)]
    return np.where(seen > 0, total, np.nan)


def _ebm(**params: object) -> object:
    import warnings

    from interpret.glassbox import ExplainableBoostingRegressor

    warnings.filterwarnings("ignore", message="Missing values detected", module="interpret")
    return ExplainableBoostingRegressor(**params)


class ThroughputModel:
    """EBM on log1p(count) per 10-minute slot; predicts the count of the slot after the past given."""

    def __init__(self, target: str = "submit_gpu_job", interactions: int = 5, outer_bags: int = 4,
                 max_rounds: int = 2000, n_jobs: int = 2, random_state: int = 0) -> None:
        self.target = target
        self.interactions = interactions
        self.outer_bags = outer_bags
        self.max_rounds = max_rounds
        self.n_jobs = n_jobs
        self.random_state = random_state

    def fit(self, counts: pd.Series) -> ThroughputModel:
        """Train on every slot that has at least one past slot."""
        started = _time.perf_counter()
        X = slot_features(counts).iloc[1:]
        y = np.log1p(counts.astype(float).iloc[1:].to_numpy())
        self.ebm_ = _ebm(interactions=self.interactions, outer_bags=self.outer_bags, max_rounds=self.max_rounds,
                         n_jobs=1 if self.outer_bags == 1 else self.n_jobs, random_state=self.random_state)
        self.ebm_.fit(X, y)
        self.feature_names_ = list(X.columns)
        self.train_window_ = (str(counts.index[0]), str(counts.index[-1]))
        self.fit_seconds_ = time_since(started)
        return self

    def predict_features(self, X: pd.DataFrame) -> np.ndarray:
        return np.clip(np.expm1(self.ebm_.predict(X[self.feature_names_])), 0.0, None)

    def predict(self, counts: pd.Series) -> np.ndarray:
        """Forecast for every slot of `counts`, each from the slots before it."""
        return self.predict_features(slot_features(counts))

    def explain(self, X: pd.DataFrame) -> list:
        """Contributions in log1p space: expm1(intercept + sum) is the forecast."""
        from lucid_core.models.contributions import explain_ebm

        return explain_ebm(self.ebm_, X[self.feature_names_])


def time_since(started: float) -> float:
    return _time.perf_counter() - started


@dataclass(frozen=True)
class ForecastScores:
    """Mean absolute error per slot of a model and its baselines on one held-out window."""

    target: str
    slots: int
    model_mae: float
    naive_mae: float
    baselines: dict[str, float]


def evaluate_throughput(series: pd.DataFrame, target: str, split: str, model: ThroughputModel,
                        hgb_random_state: int = 0) -> ForecastScores:
    """Fit on slots before `split`, score slots from `split` on against naive and HGB baselines."""
    from sklearn.ensemble import HistGradientBoostingRegressor

    counts = series[target].astype(float)
    X = slot_features(counts)
    train = X.index < pd.Timestamp(split)
    model.fit(counts[train])
    truth = counts[~train].to_numpy()
    pred = model.predict_features(X[~train])
    baselines = {}
    Xtr, ytr = X[train].iloc[1:], counts[train].iloc[1:]
    from threadpoolctl import threadpool_limits

    for name, loss, log in (("hgb_squared", "squared_error", False), ("hgb_log_target", "squared_error", True),
                            ("hgb_absolute", "absolute_error", False)):
        hgb = HistGradientBoostingRegressor(loss=loss, random_state=hgb_random_state)
        with threadpool_limits(1 if len(Xtr) < 20_000 else None):  # OpenMP threads only slow small fits down
            hgb.fit(Xtr, np.log1p(ytr) if log else ytr)
            p = hgb.predict(X[~train])
        baselines[name] = float(np.abs(truth - (np.expm1(p) if log else p)).mean())
    naive = X.loc[~train, "lag_1"].to_numpy()
    return ForecastScores(target, int((~train).sum()), float(np.abs(truth - pred).mean()),
                          float(np.abs(truth - naive).mean()), baselines)


class ThroughputForecast:
    """Online ThroughputForecaster: counts submissions per slot and asks the two EBMs.

    Times are seconds since `epoch` (trace-relative in the simulator; Unix time live).
    Until `min_history_slots` slots were observed it answers with the recent-slots mean.
    """

    def __init__(self, jobs_model: ThroughputModel, gpus_model: ThroughputModel,
                 epoch: pd.Timestamp | str = "1970-01-01", slot_s: float = SLOT_S, min_history_slots: int = 6) -> None:
        self.jobs_model = jobs_model
        self.gpus_model = gpus_model
        self.epoch = pd.Timestamp(epoch)
        self.slot_s = slot_s
        self.min_history_slots = min_history_slots
        self.counts_: dict[int, list[int]] = {}
        self.first_slot_: int | None = None
        self.fallback_ = RecentSlotsForecaster(slot_s=slot_s)
        self._cache: tuple[tuple[int, int], Forecast] | None = None
        self._observed = 0

    def observe_submission(self, time: float, gpus: int) -> None:
        slot = int(time // self.slot_s)
        if self.first_slot_ is None:
            self.first_slot_ = slot
        cell = self.counts_.setdefault(slot, [0, 0])
        cell[0] += 1
        cell[1] += int(gpus)
        self._observed += 1
        self.fallback_.observe_submission(time, gpus)
        for old in [s for s in self.counts_ if s < slot - HISTORY_SLOTS - 1]:
            del self.counts_[old]

    def _series(self, current: int, column: int) -> pd.Series:
        start = current - HISTORY_SLOTS
        slots = np.arange(start, current + 1)
        first = self.first_slot_ if self.first_slot_ is not None else current
        values = [float(self.counts_.get(s, (0, 0))[column]) if first <= s < current else math.nan for s in slots]
        index = self.epoch + pd.to_timedelta(slots * self.slot_s, unit="s")
        return pd.Series(values, index=index)

    def forecast(self, now: float) -> Forecast:
        """Submissions expected in the slot containing `now`, from the completed slots before it."""
        current = int(now // self.slot_s)
        key = (current, self._observed)
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        if self.first_slot_ is None or current - self.first_slot_ < self.min_history_slots:
            result = self.fallback_.forecast(now)
            result = Forecast(result.jobs_per_slot, result.gpus_per_slot, f"cold start: {result.source}")
        else:
            jobs_x = slot_features(self._series(current, 0)).iloc[[-1]]
            gpus_x = slot_features(self._series(current, 1)).iloc[[-1]]
            result = Forecast(float(self.jobs_model.predict_features(jobs_x)[0]),
                              float(self.gpus_model.predict_features(gpus_x)[0]), "throughput EBM")
        self._cache = (key, result)
        return result

