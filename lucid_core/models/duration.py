"""Workload Estimate Model: a GA2M (EBM) predicting log run time from who submitted what, when,
with what profile, and how long the same user's and name bucket's jobs recently ran.

History features of a job use only jobs that ENDED before it was submitted (offline this is a
replay in time order; online the same state is fed by `observe`). Never a job id. A job whose
user the model has never seen is predicted by the history fallback (user, then GPU demand).
"""

from __future__ import annotations

import heapq
import math
import statistics
import time as _time
from collections import defaultdict, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import pandas as pd

from lucid_core.domain import Job
from lucid_core.models.contributions import Explanation, explain_ebm
from lucid_core.models.ebm_scoring import EbmScorer
from lucid_core.models.monotone import monotonize_term
from lucid_core.models.names import NO_NAME, JobNameBucketer
from lucid_core.policy.predictors import HistoryDurationPredictor

PROFILE_COLUMNS = ("gpu_util", "mem_util", "gpu_mem_mb")
HISTORY_COLUMNS = ("user_mean", "user_median", "user_last", "user_n", "user_gpus_mean", "bucket_mean",
                   "bucket_last", "bucket_n", "recent_mean", "history_estimate")


class DurationHistory:
    """Recent log1p durations of ended jobs, by user, user x GPU demand, name bucket, and overall."""

    def __init__(self, keep: int = 20, keep_overall: int = 200) -> None:
        self.keep = keep
        recent = partial(deque, maxlen=keep)  # picklable, unlike a lambda
        self.by_user: dict[str, deque[float]] = defaultdict(recent)
        self.by_user_gpus: dict[tuple[str, int], deque[float]] = defaultdict(recent)
        self.by_bucket: dict[int, deque[float]] = defaultdict(recent)
        self.overall: deque[float] = deque(maxlen=keep_overall)
        self.user_count: dict[str, int] = defaultdict(int)
        self.bucket_count: dict[int, int] = defaultdict(int)

    def add(self, user: str, bucket: int, gpus: int, duration: float) -> None:
        value = math.log1p(max(0.0, duration))
        self.by_user[user].append(value)
        self.by_user_gpus[(user, gpus)].append(value)
        self.user_count[user] += 1
        if bucket != NO_NAME:
            self.by_bucket[bucket].append(value)
            self.bucket_count[bucket] += 1
        self.overall.append(value)

    def features(self, user: str, bucket: int, gpus: int) -> list[float]:
        """Values for HISTORY_COLUMNS except history_estimate (NaN where there is no history)."""
        u = self.by_user.get(user)
        ug = self.by_user_gpus.get((user, gpus))
        b = self.by_bucket.get(bucket) if bucket != NO_NAME else None
        nan = math.nan
        return [
            sum(u) / len(u) if u else nan,
            statistics.median(u) if u else nan,
            u[-1] if u else nan,
            float(len(u)) if u else 0.0,  # how many recent jobs back the means (capped: a raw count is a clock)
            sum(ug) / len(ug) if ug else nan,
            sum(b) / len(b) if b else nan,
            b[-1] if b else nan,
            float(len(b)) if b else 0.0,
            sum(self.overall) / len(self.overall) if self.overall else nan,
        ]


def _job_of(row: Any) -> Job:
    return Job(job_id=str(row.job_id), user=str(row.user), vc=str(row.vc), gpus=int(row.gpus),
               submit_time=float(row.submit_time), name=str(row.name) if isinstance(row.name, str) else "")


def _ebm(**params: Any) -> Any:
    import warnings

    from interpret.glassbox import ExplainableBoostingRegressor

    warnings.filterwarnings("ignore", message="Missing values detected", module="interpret")
    return ExplainableBoostingRegressor(**params)


class DurationModel:
    """EBM on log1p(seconds); implements DurationPredictor (predict_duration / observe).

    `condition_on_s` > 0 makes it a model of jobs already known to outlive that long (Lucid predicts
    after the profiling window): it trains only on such jobs and its history-estimate feature is the
    fallback's mean over history jobs that outlived it too. Set it to the profiler's Tprof for Lucid.
    """

    def __init__(self, interactions: int = 5, outer_bags: int = 2, max_rounds: int = 1000,
                 monotone_gpus: bool = False, max_train_rows: int | None = None, fallback_refresh_s: float = 86400.0,
                 condition_on_s: float = 0.0, weight_by_gpus: bool = False, n_jobs: int = 2,
                 random_state: int = 0) -> None:
        self.interactions = interactions
        self.outer_bags = outer_bags
        self.max_train_rows = max_train_rows
        self.max_rounds = max_rounds
        self.monotone_gpus = monotone_gpus
        self.fallback_refresh_s = fallback_refresh_s
        self.condition_on_s = condition_on_s
        self.weight_by_gpus = weight_by_gpus
        self.n_jobs = n_jobs
        self.random_state = random_state

    # ---- features -------------------------------------------------------------------------
    def prepare(self, frame: pd.DataFrame, name_source: pd.DataFrame | None = None) -> pd.DataFrame:
        """Fit the name buckets (on `name_source`, default `frame`) and replay `frame` into a design
        matrix; leaves the history state at the end of the replay."""
        names = (name_source if name_source is not None else frame)["name"].fillna("").astype(str)
        self.bucketer_ = JobNameBucketer(random_state=self.random_state).fit(names)
        self.use_user_ = bool((frame["user"].astype(str) != frame["vc"].astype(str)).any())
        self.use_names_ = bool(len(self.bucketer_.exemplars_))
        self.profile_columns_ = [c for c in PROFILE_COLUMNS if c in frame and frame[c].notna().any()]
        if "submit_at" in frame:
            first = frame.iloc[0]
            self.epoch_ = pd.Timestamp(first["submit_at"]) - pd.to_timedelta(float(first["submit_time"]), "s")
        else:
            self.epoch_ = pd.Timestamp("1970-01-01")
        return self.replay(frame)

    def replay(self, frame: pd.DataFrame) -> pd.DataFrame:
        """Design matrix of every job, history from jobs ended before its submission (time order)."""
        self.history_ = DurationHistory()
        self.fallback_ = HistoryDurationPredictor(refresh_s=self.fallback_refresh_s)
        self.history_rows_: dict[tuple[str, int, int], list[float]] = {}
        buckets = self.bucketer_.transform(frame["name"].fillna("").astype(str))
        ends = (frame["end_time"] if "end_time" in frame else frame["submit_time"] + frame["duration"]).to_numpy()
        order = np.argsort(frame["submit_time"].to_numpy(), kind="stable")
        jobs = [_job_of(r) for r in frame.itertuples(index=False)]
        durations = frame["duration"].astype(float).to_numpy()
        pending: list[tuple[float, int]] = []
        history = np.empty((len(frame), len(HISTORY_COLUMNS)))
        for i in order:
            job = jobs[i]
            while pending and pending[0][0] <= job.submit_time:
                end, j = heapq.heappop(pending)
                self._learn(jobs[j], int(buckets[j]), float(durations[j]), end)
            history[i, :-1] = self.history_.features(job.user, int(buckets[i]), job.gpus)
            history[i, -1] = math.log1p(self.fallback_.predict_one(job, self.condition_on_s)[0])
            heapq.heappush(pending, (float(ends[i]), int(i)))
        self._pending_ = [(end, j, jobs[j], int(buckets[j]), float(durations[j])) for end, j in pending]
        heapq.heapify(self._pending_)
        profiles = {c: frame[c].astype(float).to_numpy() for c in self.profile_columns_}
        return self._design(frame["vc"].astype(str).to_numpy(), frame["user"].astype(str).to_numpy(),
                            frame["gpus"].astype(float).to_numpy(), frame["submit_time"].to_numpy(dtype=float),
                            profiles, buckets, history, index=frame.index)

    def _learn(self, job: Job, bucket: int, duration: float, end: float | None) -> None:
        job.end_time = end
        self.history_rows_ = {}  # every user's overall mean moved: the cached history rows are stale
        self.history_.add(job.user, bucket, job.gpus, duration)
        self.fallback_.observe(job, duration)

    def _design(self, vc: np.ndarray, user: np.ndarray, gpus: np.ndarray, submit_time: np.ndarray,
                profiles: dict[str, np.ndarray], buckets: np.ndarray, history: np.ndarray,
                index: pd.Index | None = None) -> pd.DataFrame:
        """The model's input columns from plain arrays: one builder for training and live rows, so
        both see the same features, and no intermediate frame on the live path (a round predicts a
        handful of new jobs, where pandas' per-call costs dominate)."""
        return pd.DataFrame(self._columns(vc, user, gpus, submit_time, profiles, buckets, history),
                            index=index, copy=False)

    def _columns(self, vc: np.ndarray, user: np.ndarray, gpus: np.ndarray, submit_time: np.ndarray,
                 profiles: dict[str, np.ndarray], buckets: np.ndarray, history: np.ndarray) -> dict[str, np.ndarray]:
        """The design's columns by name, in the design's order."""
        hour, day_of_week = self._calendar(submit_time)
        cols: dict[str, Any] = {"vc": vc}
        if self.use_user_:
            cols["user"] = user
        if self.use_names_:
            cols["name_bucket"] = np.array([f"b{b}" for b in buckets], dtype=object)
        cols["gpus"] = gpus
        cols["hour"] = hour
        cols["day_of_week"] = day_of_week
        for c in self.profile_columns_:
            cols[c] = profiles[c]
        for k, c in enumerate(HISTORY_COLUMNS):
            if self.use_names_ or not c.startswith("bucket_"):
                cols[c] = history[:, k]
        return cols

    def _calendar(self, submit_time: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Hour of day (to the minute) and day of week (Monday 0) at submission, on the trace's clock."""
        epoch = self.epoch_
        if epoch.tzinfo is not None:  # a zone's local time (daylight saving): let pandas convert
            at = epoch + pd.to_timedelta(submit_time, unit="s")
            return at.hour.to_numpy() + at.minute.to_numpy() / 60.0, at.day_of_week.to_numpy().astype(float)
        # nanoseconds since 1970 in int64, floored to minutes and days (datetime64's own arithmetic, without
        # its unit conversions: a round's 16 rows paid more for those than for scoring)
        at = epoch.value + (np.asarray(submit_time, dtype=float) * 1e9).round().astype(np.int64)
        minute_of_day = at // 60_000_000_000 % 1440
        days = at // 86_400_000_000_000
        return minute_of_day // 60 + (minute_of_day % 60) / 60.0, ((days + 3) % 7).astype(float)  # 1970-01-01: Thu

    def _feature_types(self, X: pd.DataFrame) -> list[str]:
        return ["nominal" if X[c].dtype == object or str(X[c].dtype).startswith(("str", "string")) else "continuous"
                for c in X.columns]

    # ---- training -------------------------------------------------------------------------
    def fit(self, frame: pd.DataFrame) -> DurationModel:
        """Replay the log into features and fit the EBM on every job (subsampled to max_train_rows)."""
        X = self.prepare(frame)
        return self.fit_design(X, np.log1p(frame["duration"].astype(float).to_numpy()))

    def fit_design(self, X: pd.DataFrame, y_log: np.ndarray) -> DurationModel:
        started = _time.perf_counter()
        if self.condition_on_s > 0:  # learn only from jobs that outlived the window the scheduler watches
            longer = np.asarray(y_log) > math.log1p(self.condition_on_s)
            X, y_log = X[longer], np.asarray(y_log)[longer]
        if self.max_train_rows is not None and len(X) > self.max_train_rows:
            keep = np.sort(np.random.default_rng(self.random_state).choice(len(X), self.max_train_rows, replace=False))
            X, y_log = X.iloc[keep], np.asarray(y_log)[keep]
        self.feature_names_ = list(X.columns)
        exclude = [("gpus", c) for c in self.feature_names_ if c != "gpus"] if self.monotone_gpus else None
        self.ebm_ = _ebm(interactions=self.interactions, outer_bags=self.outer_bags, max_rounds=self.max_rounds,
                         feature_types=self._feature_types(X), exclude=exclude,
                         n_jobs=1 if self.outer_bags == 1 else self.n_jobs,  # one bag: worker processes only cost
                         random_state=self.random_state)
        # Lucid ranks by GPUs x duration: weighting rows by GPU demand makes errors cost what they cost there
        self.ebm_.fit(X, y_log, sample_weight=X["gpus"].to_numpy() if self.weight_by_gpus else None)
        if self.monotone_gpus:
            monotonize_term(self.ebm_, "gpus", increasing=True)
        self.scorer_ = None  # read from the tables as they are now, at the first prediction
        self.train_rows_ = len(X)
        self.fit_seconds_ = _time.perf_counter() - started
        return self

    # ---- prediction -----------------------------------------------------------------------
    def predict_log(self, X: pd.DataFrame | Mapping[str, np.ndarray]) -> np.ndarray:
        """Predicted log1p(seconds); rows whose user has no history take the fallback estimate. `X` is a
        design frame or its columns; the EBM's tables are read directly where they can be (`ebm_scoring`)."""
        scorer = self._scorer()
        pred = None if scorer is None else scorer.score(X)
        if pred is None:
            frame = X if isinstance(X, pd.DataFrame) else pd.DataFrame(X, copy=False)
            same = list(frame.columns) == self.feature_names_  # the design's own order: no column copy
            pred = np.asarray(self.ebm_.predict(frame if same else frame[self.feature_names_]), dtype=float)
        cold = np.asarray(X["user_n"]) == 0
        return np.where(cold, np.asarray(X["history_estimate"], dtype=float), pred)

    def _scorer(self) -> EbmScorer | None:
        """The fitted EBM's tables as arrays, read once per fitted EBM (a saved model gets them on first use)."""
        cached = self.__dict__.get("scorer_")
        if cached is None or cached[0] is not self.ebm_:
            cached = self.scorer_ = (self.ebm_, EbmScorer.of(self.ebm_))
        return cached[1]

    def explain(self, X: pd.DataFrame) -> list[Explanation]:
        """Contributions in log1p-seconds: expm1(intercept + sum) is the EBM's estimate."""
        return explain_ebm(self.ebm_, X[self.feature_names_])

    def features_of(self, jobs: Sequence[Job]) -> pd.DataFrame:
        """Design rows for live jobs from the current history state."""
        return pd.DataFrame(self._live_columns(jobs), copy=False)

    def _live_columns(self, jobs: Sequence[Job]) -> dict[str, np.ndarray]:
        """The design's columns for live jobs, as arrays (a frame costs more than scoring 16 rows)."""
        self._drain(max((j.submit_time for j in jobs), default=-math.inf))
        buckets = self.bucketer_.transform([j.name for j in jobs])
        history = np.empty((len(jobs), len(HISTORY_COLUMNS)))
        rows = self._history_rows()
        for i, job in enumerate(jobs):
            key = (job.user, int(buckets[i]), job.gpus)
            row = rows.get(key)
            if row is None:
                row = rows[key] = [*self.history_.features(*key),
                                   math.log1p(self.fallback_.predict_one(job, self.condition_on_s)[0])]
            history[i] = row
        profiles = {c: np.array([getattr(j.profile, c) if j.profile is not None else math.nan for j in jobs],
                                dtype=float) for c in self.profile_columns_}
        return self._columns(np.array([str(j.vc) for j in jobs], dtype=object),
                             np.array([str(j.user) for j in jobs], dtype=object),
                             np.array([j.gpus for j in jobs], dtype=float),
                             np.array([j.submit_time for j in jobs], dtype=float), profiles, buckets, history)

    def _history_rows(self) -> dict[tuple[str, int, int], list[float]]:
        """History features by (user, name bucket, GPUs) since the history last changed: they depend on
        nothing else, and a queue holds many jobs of one user and size (a model saved before this cache
        existed gets it on first use)."""
        rows = self.__dict__.get("history_rows_")
        if rows is None:
            rows = self.history_rows_ = {}
        return rows

    def predict_duration(self, jobs: Sequence[Job]) -> list[float]:
        """Seconds per job. A job that already outlived the estimate gets the history estimate
        conditioned on what it outlived (the fallback's conditional mean)."""
        if not jobs:
            return []
        seconds = np.expm1(self.predict_log(self._live_columns(jobs)))
        out = []
        for job, s in zip(jobs, seconds, strict=True):
            if job.known_min_duration > 0 and s <= job.known_min_duration:
                s = self.fallback_.predict_one(job)[0]
            out.append(float(max(s, job.known_min_duration)))
        return out

    def observe(self, job: Job, duration: float) -> None:
        if job.end_time is not None:
            self._drain(job.end_time)  # earlier ends of the training log first: history stays in end order
        self._learn(job, int(self.bucketer_.transform([job.name])[0]), duration, job.end_time)

    def _drain(self, now: float) -> None:
        """Jobs of the training log still running at its end count once their end has passed."""
        while self._pending_ and self._pending_[0][0] <= now:
            end, _, job, bucket, duration = heapq.heappop(self._pending_)
            self._learn(job, bucket, duration, end)

    def warm_history(self, frame: pd.DataFrame, until: float) -> DurationModel:
        """Reset the online state to the jobs of `frame` submitted before `until` (e.g. a simulation's
        start): those that ended by then are history, the others join it when their end passes."""
        self.replay(frame[frame["submit_time"] < until])
        self._drain(until)
        return self


@dataclass(frozen=True)
class DurationScores:
    """Held-out accuracy in log1p-seconds."""

    r2: float
    spearman: float
    mae_log: float


def score_log(truth_log: np.ndarray, pred_log: np.ndarray) -> DurationScores:
    from scipy.stats import spearmanr
    from sklearn.metrics import r2_score

    return DurationScores(float(r2_score(truth_log, pred_log)), float(spearmanr(truth_log, pred_log).statistic),
                          float(np.mean(np.abs(truth_log - pred_log))))


def hgb_baseline(X_train: pd.DataFrame, y_train: np.ndarray, X_test: pd.DataFrame, random_state: int = 0) -> np.ndarray:
    """Black-box comparison: HistGradientBoosting on the same design (categoricals as categories)."""
    from sklearn.ensemble import HistGradientBoostingRegressor

    cats = [c for c in X_train.columns if X_train[c].dtype == object or str(X_train[c].dtype).startswith("str")]
    both = pd.concat([X_train, X_test])
    for c in cats:
        both[c] = both[c].astype("category")
    from threadpoolctl import threadpool_limits

    hgb = HistGradientBoostingRegressor(categorical_features="from_dtype", random_state=random_state)
    with threadpool_limits(1 if len(X_train) < 20_000 else None):  # OpenMP threads only slow small fits down
        hgb.fit(both.iloc[: len(X_train)], y_train)
        return hgb.predict(both.iloc[len(X_train):])
