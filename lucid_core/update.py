"""Update Engine: extract the job log, validate it, train candidates, compare with the promoted models,
promote or keep, and measure drift of the models that served the recent past.

Steps exchange small JSON-safe dicts (Airflow passes them as XCom); frames and models live in files.
Model versions are rows of the store's `model_versions` table (one active per kind) pointing to
joblib artifacts under LUCID_HOME/models, with the reference error and input sample that later
drift checks compare against.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lucid_core.alerts import check_drift
from lucid_core.domain import Job

JOB_COLUMNS = ["job_id", "user", "vc", "name", "gpus", "submit_time", "start_time", "end_time", "duration", "state",
               "gpu_util", "mem_util", "gpu_mem_mb", "amp"]
FINISHED = ("COMPLETED", "FAILED", "CANCELLED")
SLOT_S = 600.0
REFERENCE_SAMPLE = 512  # input values kept per feature to compute PSI later
DURATION_INPUTS = ("gpus", "submit_hour", "gpu_util")
THROUGHPUT_INPUTS = ("submit_gpu_job",)


@dataclass(frozen=True)
class Batch:
    """Files of one extraction and the window they cover."""

    jobs_path: str
    slots_path: str
    mode: str
    since: float
    until: float
    job_rows: int
    slot_rows: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def extract_job_log(store_url: str, since: float | None = None, until: float | None = None) -> pd.DataFrame:
    """Finished jobs submitted in [since, until) with their profile, one row per job (duration = end - start)."""
    import sqlalchemy as sa

    query = ("SELECT job_id, user, vc, name, gpus, submit_time, start_time, end_time, state, gpu_util, mem_util, "
             "gpu_mem_mb, amp FROM jobs WHERE state IN ('COMPLETED', 'FAILED', 'CANCELLED')")
    bind: dict[str, float] = {}
    if since is not None:
        query += " AND submit_time >= :since"
        bind["since"] = since
    if until is not None:
        query += " AND submit_time < :until"
        bind["until"] = until
    query = query.replace(" user,", ' "user",')  # `user` is reserved in PostgreSQL
    engine = sa.create_engine(store_url)
    try:
        with engine.connect() as connection:
            frame = pd.read_sql(sa.text(query + " ORDER BY submit_time, job_id"), connection, params=bind)
    finally:
        engine.dispose()
    frame["duration"] = frame["end_time"] - frame["start_time"]
    frame["amp"] = frame["amp"].astype(bool)
    return frame[JOB_COLUMNS]


def submissions_per_slot(jobs: pd.DataFrame, slot_s: float = SLOT_S) -> pd.DataFrame:
    """GPU jobs and GPUs requested per slot, empty slots included (the throughput model's series)."""
    if jobs.empty:
        return pd.DataFrame({"time": [], "submit_gpu_job": [], "submit_gpu_num": []})
    slot = (jobs["submit_time"] // slot_s).astype(int)
    grouped = jobs.assign(slot=slot).groupby("slot").agg(submit_gpu_job=("job_id", "size"),
                                                         submit_gpu_num=("gpus", "sum"))
    grouped = grouped.reindex(range(int(slot.min()), int(slot.max()) + 1), fill_value=0)
    return pd.DataFrame({"time": grouped.index.to_numpy() * slot_s,
                         "submit_gpu_job": grouped["submit_gpu_job"].to_numpy(),
                         "submit_gpu_num": grouped["submit_gpu_num"].to_numpy()})


def training_mode(requested: str, when: float) -> str:
    """'full' on Sundays (or when asked), else 'finetune'."""
    if requested in {"finetune", "full"}:
        return requested
    return "full" if time.gmtime(when).tm_wday == 6 else "finetune"


def extract_batch(store_url: str, directory: str | Path, requested_mode: str, now: float | None,
                  finetune_days: int = 7, full_days: int = 90) -> Batch:
    """Extract the window of the mode into `directory` (jobs.csv, slots.csv)."""
    until = time.time() if now is None else now
    mode = training_mode(requested_mode, until)
    since = until - 86400.0 * (full_days if mode == "full" else finetune_days)
    jobs = extract_job_log(store_url, since=since, until=until)
    slots = submissions_per_slot(jobs)
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    jobs.to_csv(out / "jobs.csv", index=False)
    slots.to_csv(out / "slots.csv", index=False)
    return Batch(str(out / "jobs.csv"), str(out / "slots.csv"), mode, since, until, len(jobs), len(slots))


def validate_batch(batch: Batch, max_quarantine_share: float = 0.05) -> dict[str, Any]:
    """Run both suites; write clean and quarantined rows beside the batch; say why training is refused."""
    from lucid_core.validation import validate_frame

    out = Path(batch.jobs_path).parent
    report: dict[str, Any] = {"batch": batch.to_dict(), "refused": ""}
    reasons = []
    for name, path in (("job_log", batch.jobs_path), ("throughput", batch.slots_path)):
        frame = pd.read_csv(path, dtype={"job_id": str, "user": str, "vc": str, "name": str})
        outcome = validate_frame(frame, name, max_quarantine_share=max_quarantine_share)
        clean_path = out / f"{name}.clean.csv"
        outcome.clean.to_csv(clean_path, index=False)
        outcome.quarantined.to_csv(out / f"{name}.quarantined.csv", index=False)
        report[name] = outcome.summary() | {"clean_path": str(clean_path)}
        if not outcome.passed:
            reasons.append(f"{name}: {outcome.refused_reason}")
    report["refused"] = "; ".join(reasons)
    (out / "validation.json").write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")
    return report


# ---------------------------------------------------------------- models


def _jobs_of(frame: pd.DataFrame) -> list[Job]:
    return [Job(job_id=str(r.job_id), user=str(r.user), vc=str(r.vc), gpus=int(r.gpus),
                submit_time=float(r.submit_time), name=str(r.name) if isinstance(r.name, str) else "")
            for r in frame.itertuples(index=False)]


def duration_inputs(frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """The inputs whose distribution the drift check watches."""
    hours = (frame["submit_time"].to_numpy(dtype=float) % 86400.0) / 3600.0
    return {"gpus": frame["gpus"].to_numpy(dtype=float), "submit_hour": hours,
            "gpu_util": frame["gpu_util"].fillna(-1).to_numpy(dtype=float)}


class DurationCandidate:
    """The duration model the live policy consults, fitted on finished jobs (history of the same
    user and GPU demand, then user, then GPU demand); errors are absolute log1p-seconds."""

    def __init__(self, min_samples: int = 3) -> None:
        self.min_samples = min_samples

    def fit(self, frame: pd.DataFrame) -> DurationCandidate:
        from lucid_core.policy.models import HistoryDurationPredictor

        self.predictor_ = HistoryDurationPredictor(min_samples=self.min_samples).fit(
            _jobs_of(frame), frame["duration"].astype(float).tolist())
        self.rows_ = len(frame)
        return self

    def predict(self, frame: pd.DataFrame) -> np.ndarray:
        return np.asarray(self.predictor_.predict_duration(_jobs_of(frame)), dtype=float)

    def errors(self, frame: pd.DataFrame) -> np.ndarray:
        return np.abs(np.log1p(self.predict(frame)) - np.log1p(frame["duration"].to_numpy(dtype=float)))


class ThroughputCandidate:
    """The throughput EBM on jobs per slot; errors are absolute jobs per slot."""

    def __init__(self, outer_bags: int = 2, max_rounds: int = 600) -> None:
        self.outer_bags = outer_bags
        self.max_rounds = max_rounds

    def fit(self, slots: pd.DataFrame) -> ThroughputCandidate:
        from lucid_core.models.throughput import ThroughputModel

        self.model_ = ThroughputModel(outer_bags=self.outer_bags, max_rounds=self.max_rounds, n_jobs=1).fit(
            self._series(slots))
        return self

    @staticmethod
    def _series(slots: pd.DataFrame) -> pd.Series:
        index = pd.to_datetime(slots["time"].to_numpy(dtype=float), unit="s")
        return pd.Series(slots["submit_gpu_job"].to_numpy(dtype=float), index=index)

    def errors(self, slots: pd.DataFrame) -> np.ndarray:
        series = self._series(slots)
        return np.abs(self.model_.predict(series) - series.to_numpy())


def _split_recent(frame: pd.DataFrame, order: str, recent_share: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    frame = frame.sort_values(order, kind="stable").reset_index(drop=True)
    cut = max(1, min(len(frame) - 1, round(len(frame) * (1.0 - recent_share))))
    return frame.iloc[:cut], frame.iloc[cut:]


def _sample(values: np.ndarray) -> list[float]:
    values = np.asarray(values, dtype=float)
    if values.size <= REFERENCE_SAMPLE:
        return values.tolist()
    return np.quantile(values, np.linspace(0, 1, REFERENCE_SAMPLE)).tolist()


def models_dir() -> Path:
    from lucid_core.runtime.store import lucid_home

    return lucid_home() / "models"


def _active_version(store_url: str, kind: str) -> dict[str, Any] | None:
    import sqlalchemy as sa

    engine = sa.create_engine(store_url)
    try:
        with engine.connect() as connection:
            row = connection.execute(sa.text(
                "SELECT version, path, metrics FROM model_versions WHERE kind = :kind AND active = :yes "
                "ORDER BY created_at DESC LIMIT 1"), {"kind": kind, "yes": True}).first()
    finally:
        engine.dispose()
    if row is None:
        return None
    metrics = row.metrics if isinstance(row.metrics, dict) else json.loads(row.metrics or "{}")
    return {"version": row.version, "path": row.path, "metrics": metrics}


def train_and_evaluate(store_url: str, checked: dict[str, Any], recent_share: float, run_id: str | None) -> dict:
    """Fit each candidate on the older part of its clean frame and score it and the promoted one on the rest."""
    import joblib

    version = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + (run_id or "manual")[-12:].replace(":", "")
    out = models_dir()
    evaluation: dict[str, Any] = {"version": version, "models": {}}
    plans = (("duration", "job_log", "end_time", DurationCandidate, duration_inputs),
             ("throughput", "throughput", "time", ThroughputCandidate,
              lambda f: {"submit_gpu_job": f["submit_gpu_job"].to_numpy(dtype=float)}))
    for kind, suite, order, factory, inputs in plans:
        frame = pd.read_csv(checked[suite]["clean_path"], dtype={"job_id": str, "user": str, "vc": str, "name": str})
        if len(frame) < 4:
            evaluation["models"][kind] = {"skipped": f"only {len(frame)} clean rows"}
            continue
        older, recent = _split_recent(frame, order, recent_share)
        started = time.perf_counter()
        candidate = factory().fit(older)
        fit_s = time.perf_counter() - started
        candidate_errors = candidate.errors(recent)
        path = out / kind / f"{version}.joblib"
        path.parent.mkdir(parents=True, exist_ok=True)
        joblib.dump(candidate, path)
        entry: dict[str, Any] = {
            "candidate_path": str(path), "candidate_mae": float(candidate_errors.mean()), "fit_seconds": fit_s,
            "train_rows": len(older), "recent_rows": len(recent),
            "reference_inputs": {k: _sample(v) for k, v in inputs(older).items()},
            "recent_inputs": {k: _sample(v) for k, v in inputs(recent).items()},
        }
        promoted = _active_version(store_url, kind)
        if promoted is not None:
            previous = joblib.load(promoted["path"])
            previous_errors = previous.errors(recent)
            entry.update(promoted_version=promoted["version"], promoted_mae=float(previous_errors.mean()),
                         promoted_reference_mae=float(promoted["metrics"].get("reference_mae", math.nan)),
                         promoted_reference_inputs=promoted["metrics"].get("reference_inputs", {}),
                         promoted_recent_errors=_sample(previous_errors),
                         promoted_reference_errors=promoted["metrics"].get("reference_errors", []))
        entry["candidate_errors"] = _sample(candidate_errors)
        evaluation["models"][kind] = entry
    return evaluation


def promote_or_keep(store_url: str, evaluation: dict[str, Any], tolerance: float = 1.0) -> dict[str, Any]:
    """Promote each candidate whose recent error is at most `tolerance` x the promoted model's; else keep."""
    import sqlalchemy as sa

    engine = sa.create_engine(store_url)
    decisions: dict[str, Any] = {}
    try:
        with engine.begin() as connection:
            for kind, entry in evaluation["models"].items():
                if "skipped" in entry:
                    decisions[kind] = {"action": "keep", "why": entry["skipped"]}
                    continue
                promoted_mae = entry.get("promoted_mae")
                better = promoted_mae is None or entry["candidate_mae"] <= tolerance * promoted_mae
                if better:
                    connection.execute(sa.text("UPDATE model_versions SET active = :no WHERE kind = :kind"),
                                       {"no": False, "kind": kind})
                    metrics = {"reference_mae": entry["candidate_mae"], "reference_errors": entry["candidate_errors"],
                               "reference_inputs": entry["reference_inputs"], "train_rows": entry["train_rows"],
                               "recent_rows": entry["recent_rows"], "fit_seconds": entry["fit_seconds"]}
                    connection.execute(sa.text(
                        "INSERT INTO model_versions (kind, version, path, created_at, metrics, active, note) "
                        "VALUES (:kind, :version, :path, :created, :metrics, :yes, :note)"),
                        {"kind": kind, "version": evaluation["version"], "path": entry["candidate_path"],
                         "created": time.time(), "metrics": json.dumps(metrics), "yes": True,
                         "note": "promoted by the Update Engine"})
                    why = ("no promoted model yet" if promoted_mae is None else
                           f"candidate MAE {entry['candidate_mae']:.4g} <= promoted {promoted_mae:.4g}")
                else:
                    why = f"candidate MAE {entry['candidate_mae']:.4g} > promoted {promoted_mae:.4g}"
                decisions[kind] = {"action": "promote" if better else "keep", "why": why}
    finally:
        engine.dispose()
    return {"decisions": decisions, "evaluation": evaluation}


def drift_reports(decision: dict[str, Any], mae_ratio: float, psi: float) -> list[dict[str, Any]]:
    """Drift of the models that were promoted before this run, on the recent data they served."""
    reports = []
    for kind, entry in decision["evaluation"]["models"].items():
        if "promoted_recent_errors" not in entry or not entry.get("promoted_reference_errors"):
            continue
        report = check_drift(kind, entry["promoted_reference_errors"], entry["promoted_recent_errors"],
                             entry.get("promoted_reference_inputs", {}), entry["recent_inputs"], mae_ratio, psi)
        reports.append(report.to_dict() | {"body": report.body, "version": entry.get("promoted_version")})
    return reports


def save_drift_history(directory: str | Path, run_id: str | None, reports: list[dict[str, Any]],
                       alert_to: str = "") -> Path:
    """Append this run's drift reports to the history the plugin shows."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    path = out / f"{stamp}-{(run_id or 'manual').replace(':', '').replace('+', '')[-24:]}.json"
    path.write_text(json.dumps({"run_id": run_id, "time": time.time(), "reports": reports,
                                "alert_sent_to": alert_to}, indent=2, default=str), encoding="utf-8")
    return path
