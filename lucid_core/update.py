"""Update Engine: extract the job log, validate it, train candidates, compare with the promoted models,
promote or keep, and measure drift of the models that served the recent past.

Steps exchange small JSON-safe dicts (Airflow passes them as XCom); frames and models live in files.
Artifacts go to the model registry (LUCID_HOME/models/registry, one promoted version per model);
the store's `model_versions` table records each promoted version with the reference errors and
input sample that later drift checks compare against.
"""

from __future__ import annotations

import csv
import json
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from lucid_core.alerts import check_drift, window_spread
from lucid_core.policy.view import saved_float

if TYPE_CHECKING:
    from lucid_core.runtime.store.store import Store

JOB_COLUMNS = ["job_id", "user", "vc", "name", "gpus", "submit_time", "start_time", "end_time", "duration", "state",
               "gpu_util", "mem_util", "gpu_mem_mb", "amp", "preemptible", "time_limit_s"]
SLOT_S = 600.0
REFERENCE_SAMPLE = 512  # input values kept per feature to compute PSI later
DURATION_INPUTS = ("gpus", "submit_hour", "gpu_util")
#: the job log's number columns, as numbers whatever the store holds (text there is missing)
NUMBER_COLUMNS = ("gpus", "submit_time", "start_time", "end_time", "gpu_util", "mem_util", "gpu_mem_mb",
                  "time_limit_s")
#: the batch files' text columns: read as text whatever they hold ("NA", "None" and "nan" can be user names)
TEXT_COLUMNS = ("job_id", "user", "vc", "name", "state")
#: end states a job reaches without ever starting (cancelled in the queue, refused at every launch)
NEVER_STARTED_STATES = ("CANCELLED", "FAILED")
THROUGHPUT_INPUTS = ("submit_gpu_job",)
MIN_CHECK_ROWS = 8  # clean rows a model is trained or drift-checked on at the least


@contextmanager
def _opened(store_url: str) -> Iterator[Store]:
    """The store at `store_url` as it is, disposed after use: the Update Engine reads it through
    `runtime.queries` and writes it through the store's functions, and never migrates it."""
    from lucid_core.runtime.store.store import Store

    store = Store(store_url, migrate=False)
    try:
        yield store
    finally:
        store.dispose()


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
    unstarted_rows: int = 0  # jobs that ended without starting: counted as submissions, not in jobs.csv

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def store_time(store_url: str) -> float:
    """The store's clock (`Store.now`), the one job times are written with: windows count back from it."""
    with _opened(store_url) as store:
        return store.now()


def extract_job_log(store_url: str, since: float | None = None, until: float | None = None) -> pd.DataFrame:
    """Finished jobs submitted in [since, until) with their profile, one row per job (duration = end - start)."""
    from lucid_core.runtime.surfaces.queries import JOB_LOG_FIELDS, finished_job_log

    with _opened(store_url) as store:
        rows = finished_job_log(store, since, until)
    frame = pd.DataFrame.from_records(rows, columns=list(JOB_LOG_FIELDS), coerce_float=True)
    for column in NUMBER_COLUMNS:  # SQLite keeps text a hand edit put in a number column: it failed every run
        frame[column] = pd.to_numeric(frame[column], errors="coerce")  # now NaN, which validation quarantines
    frame["duration"] = frame["end_time"] - frame["start_time"]
    frame["amp"] = frame["amp"].astype(bool)
    frame["preemptible"] = frame["preemptible"].fillna(False).astype(bool)
    return frame[JOB_COLUMNS]


def write_batch_frame(frame: pd.DataFrame, path: str | Path) -> None:
    """Write a batch file with every field quoted: a carriage return in a job's name or user (a value another
    writer can store) was written bare, read back as a line break, and broke the whole batch."""
    frame.to_csv(path, index=False, quoting=csv.QUOTE_ALL)


def read_batch_frame(path: str | Path) -> pd.DataFrame:
    """Read a batch file as `write_batch_frame` wrote it: text columns as text and only an empty field missing
    (pandas' default reads a user called "NA", "None" or "null" as missing: each of their jobs was quarantined,
    and a busy such user had training refused)."""
    return pd.read_csv(path, dtype=dict.fromkeys(TEXT_COLUMNS, str), keep_default_na=False, na_values=[""])


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


def started(jobs: pd.DataFrame) -> pd.Series:
    """Which jobs of the log ran: one cancelled while it queued (or refused at every launch) has no start and no
    run time to learn from, and is normal (users cancel queued jobs), so it must not count as a bad row; a job
    without a start in any other end state stays, for validation to quarantine."""
    return jobs["start_time"].notna() | ~jobs["state"].isin(NEVER_STARTED_STATES)


def training_mode(requested: str, when: float) -> str:
    """'full' on Sundays (or when asked), else 'finetune'."""
    if requested in {"finetune", "full"}:
        return requested
    return "full" if time.gmtime(when).tm_wday == 6 else "finetune"


def extract_batch(store_url: str, directory: str | Path, requested_mode: str, now: float | None,
                  finetune_days: int = 7, full_days: int = 90) -> Batch:
    """Extract the window of the mode into `directory`: jobs.csv (the finished jobs that started) and slots.csv
    (submissions per slot, every finished job's)."""
    until = store_time(store_url) if now is None else now
    mode = training_mode(requested_mode, until)
    since = until - 86400.0 * (full_days if mode == "full" else finetune_days)
    jobs = extract_job_log(store_url, since=since, until=until)
    slots = submissions_per_slot(jobs)  # every submission, started or not: the load the forecaster learns
    ran = started(jobs)
    # the jobs that ended by `until`: a promoted model learns live those that end after it (`load_snapshot`), so
    # the two sets meet at `until` and none is learned twice or never (a job with no end time stays for
    # validation to quarantine)
    jobs = jobs[ran & ~(jobs["end_time"] >= until)]
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    write_batch_frame(jobs, out / "jobs.csv")
    write_batch_frame(slots, out / "slots.csv")
    return Batch(str(out / "jobs.csv"), str(out / "slots.csv"), mode, since, until, len(jobs), len(slots),
                 int((~ran).sum()))


def validate_batch(batch: Batch, max_quarantine_share: float = 0.05) -> dict[str, Any]:
    """Run both suites; write clean and quarantined rows beside the batch; say why training is refused, and
    whether only for too few rows (`too_few_rows`: the run skips training, where bad data fails it)."""
    from lucid_core.validation import validate_frame

    out = Path(batch.jobs_path).parent
    report: dict[str, Any] = {"batch": batch.to_dict(), "refused": "", "too_few_rows": False}
    reasons = []
    short = []
    for name, path in (("job_log", batch.jobs_path), ("throughput", batch.slots_path)):
        frame = read_batch_frame(path)
        outcome = validate_frame(frame, name, max_quarantine_share=max_quarantine_share)
        clean_path = out / f"{name}.clean.csv"
        write_batch_frame(outcome.clean, clean_path)
        write_batch_frame(outcome.quarantined, out / f"{name}.quarantined.csv")
        report[name] = outcome.summary() | {"clean_path": str(clean_path)}
        if not outcome.passed:
            advice = _advice(name, outcome, batch)
            reasons.append(f"{name}: {outcome.refused_reason}" + (f"; {advice}" if advice else ""))
            short.append(outcome.too_few_rows)
    report["refused"] = "; ".join(reasons)
    report["too_few_rows"] = bool(short) and all(short)  # training waits for more rows; else bad data
    (out / "validation.json").write_text(json.dumps(report, indent=2, default=str), encoding="utf-8")
    return report


def _advice(suite: str, outcome: Any, batch: Batch) -> str:
    """What an operator can do about a refused batch (too few rows is the usual first-week case)."""
    short = next((f for f in outcome.clean_failures or outcome.first_pass_failures
                  if f.expectation == "expect_table_row_count_to_be_between"), None)
    if short is None:
        return "see validation.json beside the batch for the failing rows and expectations"
    need = short.bounds[0]
    longer = ("run with mode=full for the longer window" if batch.mode != "full" else
              "give full_days a longer window")  # already mode=full: the advice to run it said nothing new
    if suite == "job_log":
        return (f"what to do: let at least {need} jobs finish in the {batch.mode} window (then the next run "
                f"trains), {longer}, or lower the bound in include/gx/job_log.json; "
                "until then the scheduler predicts durations from job history")
    return (f"what to do: the load forecast needs submissions in at least {need} slots of {SLOT_S / 60:.0f} min; "
            f"wait for more submission history or {longer}")


# ---------------------------------------------------------------- models


def duration_inputs(frame: pd.DataFrame) -> dict[str, np.ndarray]:
    """The inputs whose distribution the drift check watches."""
    hours = (frame["submit_time"].to_numpy(dtype=float) % 86400.0) / 3600.0
    return {"gpus": frame["gpus"].to_numpy(dtype=float), "submit_hour": hours,
            "gpu_util": frame["gpu_util"].fillna(-1).to_numpy(dtype=float)}


def input_spread(inputs: dict[str, np.ndarray], window: int) -> dict[str, float]:
    """Per input, the largest PSI that windows of `window` consecutive rows of the training window reach
    against the whole of it (`alerts.window_spread`), each kept as a drift check keeps its values."""
    return {name: window_spread(kept_sample(values), values, window, keep=kept_sample)
            for name, values in inputs.items()}


def throughput_inputs(slots: pd.DataFrame) -> dict[str, np.ndarray]:
    return {"submit_gpu_job": slots["submit_gpu_job"].to_numpy(dtype=float)}


class DurationCandidate:
    """The duration EBM (`lucid_core.models.duration.DurationModel`); errors in absolute log1p-seconds.

    Recent jobs are scored leak-free: the log is replayed in time order so each job's history
    features hold only jobs that ended before it was submitted."""

    def __init__(self, model=None, outer_bags: int = 2, max_rounds: int = 1000) -> None:
        self.model = model
        self.outer_bags = outer_bags
        self.max_rounds = max_rounds

    def fit(self, frame: pd.DataFrame) -> DurationCandidate:
        from lucid_core.models.duration import DurationModel

        self.model = DurationModel(outer_bags=self.outer_bags, max_rounds=self.max_rounds, n_jobs=1).fit(frame)
        return self

    def errors(self, frame: pd.DataFrame, recent: np.ndarray) -> np.ndarray:
        design = self.model.replay(frame)
        predicted = self.model.predict_log(design[recent])
        return np.abs(predicted - np.log1p(frame["duration"].to_numpy(dtype=float)[recent]))


class ThroughputCandidate:
    """The online throughput forecaster the live round consults (`ThroughputForecast`: one EBM for GPU
    jobs and one for GPUs requested per slot); errors in absolute GPU jobs per slot (the paper's metric),
    each slot forecast from the slots before it."""

    def __init__(self, model=None, outer_bags: int = 2, max_rounds: int = 600) -> None:
        self.model = model
        self.outer_bags = outer_bags
        self.max_rounds = max_rounds

    @staticmethod
    def series(slots: pd.DataFrame, column: str = "submit_gpu_job") -> pd.Series:
        index = pd.to_datetime(slots["time"].to_numpy(dtype=float), unit="s")
        return pd.Series(slots[column].to_numpy(dtype=float), index=index)

    def fit(self, slots: pd.DataFrame) -> ThroughputCandidate:
        from lucid_core.models.throughput import ThroughputForecast, ThroughputModel

        fitted = {column: ThroughputModel(target=column, outer_bags=self.outer_bags, max_rounds=self.max_rounds,
                                          n_jobs=1).fit(self.series(slots, column))
                  for column in ("submit_gpu_job", "submit_gpu_num")}
        # live times are Unix seconds, so the forecaster's clock starts at the Unix epoch
        self.model = ThroughputForecast(fitted["submit_gpu_job"], fitted["submit_gpu_num"], epoch="1970-01-01",
                                        slot_s=SLOT_S)
        return self

    def errors(self, slots: pd.DataFrame, recent: np.ndarray) -> np.ndarray:
        series = self.series(slots)
        return np.abs(self.model.jobs_model.predict(series)[recent] - series.to_numpy()[recent])


#: registry name -> kind of its rows in the store's model_versions (what the live round loads)
STORE_KINDS = {"duration": "duration", "throughput": "throughput_forecaster"}

#: registry name -> (clean frame of the validation report, time column, candidate class, drift inputs)
MODEL_PLANS = {
    "duration": ("job_log", "end_time", DurationCandidate, duration_inputs),
    "throughput": ("throughput", "time", ThroughputCandidate, throughput_inputs),
}


def contended_nodes(gpus: np.ndarray, durations: np.ndarray, submits: np.ndarray, gpus_per_node: int = 8,
                    target_load: float = 0.9) -> int:
    """A cluster size at which the jobs contend: offered GPU-seconds over the submission span fill
    `target_load` of it (never narrower than the widest job)."""
    widest = math.ceil(float(gpus.max()) / gpus_per_node) if gpus.size else 1
    span = float(submits.max() - submits.min()) if submits.size else 0.0
    if span <= 0:
        return max(1, widest)
    offered = float((gpus * durations).sum()) / span  # GPUs busy on average
    return max(1, widest, math.ceil(offered / (gpus_per_node * target_load)))


def simulated_duration_check(frame: pd.DataFrame, recent: np.ndarray, model: Any, seed: int = 0,
                             target_load: float = 0.9) -> dict[str, Any]:
    """Lucid in the simulator on the recent jobs at a contended size, once with the candidate duration
    model and once with the history fallback (both know only the older jobs, then what ends). Better
    offline error does not imply shorter JCT: noisy per-job estimates reorder similar jobs in a
    non-preemptive queue (BENCHMARKS: on Philly at 40 nodes every EBM lost to the fallback)."""
    from lucid_core.config import LucidConfig
    from lucid_core.sim.catalog import WorkloadCatalog
    from lucid_core.sim.experiment import Experiment, run_policy
    from lucid_core.sim.records import TraceRecord, stored_flag

    def records(rows: pd.DataFrame) -> list[TraceRecord]:
        rows = rows.sort_values("submit_time", kind="stable")
        return [TraceRecord(str(r.job_id), float(r.submit_time), max(1.0, float(r.duration)), max(1, int(r.gpus)),
                            vc=str(r.vc), user=str(r.user), name=r.name if isinstance(r.name, str) else "",
                            preemptible=stored_flag(getattr(r, "preemptible", False)))
                for r in rows.itertuples(index=False)]

    window, history = records(frame[recent]), records(frame[~recent])
    config = LucidConfig()
    nodes = contended_nodes(np.array([r.gpus for r in window], dtype=float),
                            np.array([r.duration for r in window], dtype=float),
                            np.array([r.submit_time for r in window], dtype=float),
                            config.cluster.gpus_per_node, target_load)
    exp = Experiment(window, history, WorkloadCatalog.synthetic(seed), config, nodes, seed)
    _, fallback = run_policy("lucid", exp)
    model.warm_history(frame, until=window[0].submit_time)
    _, candidate = run_policy("lucid", exp, duration_model=model)
    return {"nodes": nodes, "jobs": len(window), "fallback_avg_jct_s": float(fallback["avg_jct_s"]),
            "candidate_avg_jct_s": float(candidate["avg_jct_s"]),
            "fallback_p999_queue_s": float(fallback["p999_queue_s"]),
            "candidate_p999_queue_s": float(candidate["p999_queue_s"]),
            "candidate_wins": float(candidate["avg_jct_s"]) <= float(fallback["avg_jct_s"])}


def _recent_mask(frame: pd.DataFrame, recent_share: float) -> np.ndarray:
    """The most recent `recent_share` of rows (frame sorted by time), at least one and not all."""
    cut = max(1, min(len(frame) - 1, round(len(frame) * (1.0 - recent_share))))
    mask = np.zeros(len(frame), dtype=bool)
    mask[cut:] = True
    return mask


def kept_sample(values: np.ndarray) -> list[float]:
    """What a drift check keeps of a window's values: all of them up to REFERENCE_SAMPLE, else that many
    evenly spaced quantiles."""
    values = np.asarray(values, dtype=float)
    if values.size <= REFERENCE_SAMPLE:
        return values.tolist()
    return np.quantile(values, np.linspace(0, 1, REFERENCE_SAMPLE)).tolist()


def registry_root() -> Path:
    """LUCID_HOME/models/registry: the model registry the Update Engine promotes into."""
    from lucid_core.models.registry import models_root

    return models_root() / "registry"


def _artifact(name: str, version: int) -> Path:
    """The registry's joblib file of a version (layout <root>/<name>/vNNNN/model.joblib)."""
    return registry_root() / name / f"v{version:04d}" / "model.joblib"


def _reference(store_url: str, kind: str, version: int) -> dict[str, Any]:
    """Drift reference (errors and inputs at promotion) kept in the store's model_versions row."""
    from lucid_core.runtime.surfaces.queries import model_version_metrics

    with _opened(store_url) as store:
        return model_version_metrics(store, kind, str(version))


def finite_numbers(values: Any) -> list[float]:
    """A stored drift reference's values as floats, the non-finite left out; [] unless it is a list of numbers
    (the reference is JSON in the store, which another writer can fill with text, nulls or nested lists: each
    failed the drift check of every later run, and the other model's alert with it)."""
    if not isinstance(values, list) or not all(type(v) in (int, float) for v in values):
        return []
    return [f for f in map(saved_float, values) if f is not None]  # 10**400 too: it failed every later run


def reference_inputs(inputs: Any) -> dict[str, list[float]]:
    """A stored drift reference's inputs, feature -> finite values; a feature without any is left out."""
    if not isinstance(inputs, dict):
        return {}
    kept = {str(feature): finite_numbers(values) for feature, values in inputs.items()}
    return {feature: values for feature, values in kept.items() if values}


def reference_spread(spread: Any) -> dict[str, float]:
    """A stored drift reference's input spread, feature -> a finite PSI >= 0; anything else left out (a version
    promoted before the spread was kept has none: its check uses the threshold and the sampling noise)."""
    if not isinstance(spread, dict):
        return {}
    kept = {str(feature): saved_float(value) for feature, value in spread.items()}
    return {feature: value for feature, value in kept.items() if value is not None and value >= 0}


def served_version(store_url: str, registry: Any, name: str) -> int | None:
    """The promoted version of registry model `name`: the one the store's active `model_versions` row names (what
    the live round loads) when the registry holds it, else the registry's PROMOTED pointer. The store is written
    first at a promotion, so a run that died before the pointer moved left the store right; the pointer is set
    to match here, so the model pages show the model that serves."""
    from lucid_core.runtime.surfaces.queries import active_model_version

    with _opened(store_url) as store:
        stored = active_model_version(store, STORE_KINDS[name])
    pointer = registry.promoted_version(name)
    if stored is None or not (stored.isascii() and stored.isdigit()) or int(stored) not in registry.versions(name):
        return pointer
    if pointer != int(stored):
        registry.promote(name, int(stored))
    return int(stored)


def _promoted_errors(registry: Any, name: str, version: int | None, candidate_class: type, frame: pd.DataFrame,
                     recent: np.ndarray) -> tuple[np.ndarray | None, str]:
    """The promoted version's errors on the recent rows, or None and why it could not be scored: an artifact cut
    short, missing or replaced by something else failed every later run (and the live round serves the history
    fallback in its place, so the candidate is judged as if nothing were promoted)."""
    if version is None:
        return None, ""
    try:
        return candidate_class(model=registry.load(name, version)).errors(frame, recent), ""
    except Exception as exc:  # unpickling runs whatever the file holds: any error means "unreadable"
        return None, f"promoted version {version} is unreadable ({type(exc).__name__}: {str(exc)[:200]})"


def train_and_evaluate(store_url: str, checked: dict[str, Any], recent_share: float, run_id: str | None) -> dict:
    """Fit each candidate on the older part of its clean frame; score it and the promoted one on the rest."""
    from lucid_core.models.datasets import frame_sha256
    from lucid_core.models.registry import ModelRegistry

    registry = ModelRegistry(registry_root())
    evaluation: dict[str, Any] = {"run_id": run_id, "models": {}}
    for kind, (suite, order, candidate_class, inputs) in MODEL_PLANS.items():
        frame = read_batch_frame(checked[suite]["clean_path"])
        if len(frame) < MIN_CHECK_ROWS:
            evaluation["models"][kind] = {"skipped": f"only {len(frame)} clean rows"}
            continue
        frame = frame.sort_values(order, kind="stable").reset_index(drop=True)
        recent = _recent_mask(frame, recent_share)
        older = frame[~recent].reset_index(drop=True)
        started = time.perf_counter()
        candidate = candidate_class().fit(older)
        fit_s = time.perf_counter() - started
        candidate_errors = candidate.errors(frame, recent)
        window = (str(older[order].min()), str(older[order].max()))
        version = registry.register(kind, candidate.model, kind=kind, training_window=window,
                                    data_hash=frame_sha256(older),
                                    metrics={"recent_mae": float(candidate_errors.mean()), "fit_seconds": fit_s,
                                             "train_rows": len(older), "recent_rows": int(recent.sum())})
        entry: dict[str, Any] = {
            "candidate_version": version.version, "candidate_mae": float(candidate_errors.mean()),
            "candidate_errors": kept_sample(candidate_errors), "fit_seconds": fit_s, "train_rows": len(older),
            "recent_rows": int(recent.sum()), "training_window": list(window),
            "reference_inputs": {k: kept_sample(v) for k, v in inputs(older).items()},
            "recent_inputs": {k: kept_sample(v) for k, v in inputs(frame[recent]).items()},
            "reference_input_spread": input_spread(inputs(older), int(recent.sum())),
        }
        if kind == "duration" and int(recent.sum()) >= 8:
            entry["sim_check"] = simulated_duration_check(frame, recent, candidate.model)
        entry.update(_promoted_entry(store_url, registry, kind, candidate_class, frame, recent))
        evaluation["models"][kind] = entry
    return evaluation


def _promoted_entry(store_url: str, registry: Any, kind: str, candidate_class: type, frame: pd.DataFrame,
                    recent: np.ndarray) -> dict[str, Any]:
    """The serving version of `kind` scored on the `recent` rows, with the drift reference kept at its promotion
    (the `promoted_*` keys a drift check reads); {} when none serves."""
    promoted = served_version(store_url, registry, kind)
    previous_errors, unreadable = _promoted_errors(registry, kind, promoted, candidate_class, frame, recent)
    if unreadable:
        return {"promoted_version": promoted, "promoted_unreadable": unreadable}
    if promoted is None:
        return {}
    reference = _reference(store_url, STORE_KINDS[kind], promoted)
    return {"promoted_version": promoted, "promoted_mae": float(previous_errors.mean()),
            "promoted_recent_errors": kept_sample(previous_errors),
            "promoted_reference_errors": finite_numbers(reference.get("reference_errors")),
            "promoted_reference_inputs": reference_inputs(reference.get("reference_inputs")),
            "promoted_reference_spread": reference_spread(reference.get("reference_input_spread"))}


def serving_evaluation(store_url: str, checked: dict[str, Any], run_id: str | None) -> dict[str, Any]:
    """The drift check's input when training was skipped for too few rows, shaped as `promote_or_keep`'s decision
    (no decisions): the models serving now scored on every clean row of the batch (no candidate is trained, so no
    row is held back); a model with fewer than MIN_CHECK_ROWS clean rows, or none serving, is not checked."""
    from lucid_core.models.registry import ModelRegistry

    registry = ModelRegistry(registry_root())
    models: dict[str, Any] = {}
    for kind, (suite, order, candidate_class, inputs) in MODEL_PLANS.items():
        frame = read_batch_frame(checked[suite]["clean_path"])
        if len(frame) < MIN_CHECK_ROWS:
            models[kind] = {"skipped": f"only {len(frame)} clean rows"}
            continue
        frame = frame.sort_values(order, kind="stable").reset_index(drop=True)
        every = np.ones(len(frame), dtype=bool)
        models[kind] = ({"recent_rows": len(frame), "recent_inputs": {k: kept_sample(v) for k, v in
                                                                      inputs(frame).items()}}
                        | _promoted_entry(store_url, registry, kind, candidate_class, frame, every))
    return {"decisions": {}, "evaluation": {"run_id": run_id, "models": models}}


def promote_or_keep(store_url: str, evaluation: dict[str, Any], tolerance: float = 1.0) -> dict[str, Any]:
    """Promote each candidate whose recent error is at most `tolerance` x the promoted model's; else keep.

    The store's model_versions gets the version with its drift reference (the candidate's recent errors and
    training inputs) and becomes the active row; then the registry's PROMOTED pointer moves. Pointers moved
    before the store's commit, and a commit that failed left them naming versions nothing served or recorded:
    the next run compared its candidates with those, and had no drift reference for them."""
    from lucid_core.models.registry import ModelRegistry
    from lucid_core.runtime.store.store import record_promotion

    registry = ModelRegistry(registry_root())
    decisions: dict[str, Any] = {}
    promoted: list[tuple[str, int]] = []
    with _opened(store_url) as store, store.session() as session:
        for kind, entry in evaluation["models"].items():
            if "skipped" in entry:
                decisions[kind] = {"action": "keep", "why": entry["skipped"]}
                continue
            promoted_mae = entry.get("promoted_mae")
            better = promoted_mae is None or entry["candidate_mae"] <= tolerance * promoted_mae
            version = entry["candidate_version"]
            check = entry.get("sim_check")
            if better and check is not None and not check["candidate_wins"]:
                decisions[kind] = {"action": "keep", "version": version, "why": (
                    f"candidate loses in the simulator ({check['jobs']} recent jobs, {check['nodes']} nodes): "
                    f"avg JCT {check['candidate_avg_jct_s'] / 3600:.3f} h vs history fallback "
                    f"{check['fallback_avg_jct_s'] / 3600:.3f} h: kept")}
                continue
            if better:
                promoted.append((kind, version))
                metrics = {"reference_mae": entry["candidate_mae"], "reference_errors": entry["candidate_errors"],
                           "reference_inputs": entry["reference_inputs"],
                           "reference_input_spread": entry.get("reference_input_spread", {}),
                           "train_rows": entry["train_rows"], "recent_rows": entry["recent_rows"],
                           "fit_seconds": entry["fit_seconds"],
                           "training_window": entry["training_window"]}
                record_promotion(session, STORE_KINDS[kind], str(version), str(_artifact(kind, version)), metrics,
                                 f"promoted by the Update Engine ({evaluation.get('run_id') or 'manual'})")
                why = (f"{entry['promoted_unreadable']}: replaced" if "promoted_unreadable" in entry else
                       "no promoted model yet" if promoted_mae is None else
                       f"candidate MAE {entry['candidate_mae']:.4g} <= promoted {promoted_mae:.4g}")
            else:
                why = f"candidate MAE {entry['candidate_mae']:.4g} > promoted {promoted_mae:.4g}: kept"
            decisions[kind] = {"action": "promote" if better else "keep", "version": version, "why": why}
    for kind, version in promoted:  # after the store's rows committed: a failed commit moves no pointer
        registry.promote(kind, version)
    return {"decisions": decisions, "evaluation": evaluation}


def publish_model_pages(directory: str | Path) -> list[str]:
    """Shape-function plots of the promoted EBMs and the packing tree as text, for the plugin's model page."""
    from lucid_core.models.contributions import plot_shape_functions
    from lucid_core.models.registry import ModelRegistry

    out = Path(directory)
    written: list[str] = []
    registry = ModelRegistry(registry_root())
    for kind in MODEL_PLANS:
        version = registry.promoted_version(kind)
        if version is None:
            continue
        model = registry.load(kind, version)
        target = out / kind / f"v{version:04d}"
        if not target.is_dir():
            ebms = [("", model.ebm_)] if hasattr(model, "ebm_") else [
                ("jobs_", model.jobs_model.ebm_), ("gpus_", model.gpus_model.ebm_)]
            for label, ebm in ebms:
                written += [str(p) for p in plot_shape_functions(ebm, target, prefix=f"{kind}_{label}".rstrip("_"))]
    tree_text = out / "packing" / "tree.txt"
    if not tree_text.exists():
        from lucid_core.models.packing import PackingTree, default_tree_path

        if default_tree_path().is_file():
            tree_text.parent.mkdir(parents=True, exist_ok=True)
            tree_text.write_text(PackingTree.load_json(default_tree_path()).export_text(), encoding="utf-8")
            written.append(str(tree_text))
    return written


def drift_reports(decision: dict[str, Any], mae_ratio: float, psi: float, *,
                  drifted_before: dict[str, int] | None = None, checks_to_alert: int = 1) -> list[dict[str, Any]]:
    """Drift of the models that were promoted before this run, on the recent data they served. A drifted
    model alerts once `checks_to_alert` checks in a row drifted, counting `drifted_before` (per model, the
    checks just before this one that drifted one after another: `drifted_checks_before`)."""
    reports = []
    for kind, entry in decision["evaluation"]["models"].items():
        if "promoted_recent_errors" not in entry or not entry.get("promoted_reference_errors"):
            continue
        report = check_drift(kind, entry["promoted_reference_errors"], entry["promoted_recent_errors"],
                             entry.get("promoted_reference_inputs", {}), entry["recent_inputs"], mae_ratio, psi,
                             entry.get("promoted_reference_spread", {}))
        in_a_row = 1 + (drifted_before or {}).get(kind, 0) if report.drifted else 0
        report = replace(report, in_a_row=in_a_row, checks_to_alert=checks_to_alert)
        reports.append(report.to_dict() | {"body": report.body, "version": entry.get("promoted_version")})
    return reports


def drifted_checks_before(directory: str | Path, this_run: str | None = None, most: int = 50) -> dict[str, int]:
    """Per model, how many of the latest checks in the drift history drifted one after another, newest first
    (`this_run`'s own record, left by an earlier try of its task, is not one of them; a run with two records, its
    check retried, counts once, by its newest). A run that did not check a model says nothing of it and is passed
    over; a check that did not drift, or a history file that cannot be read (cut short, not one of ours), ends the
    count. Checks of the versions a retraining promoted in between count: the model a kind served drifted in
    each (with a new version promoted at every run, counting one version's checks alone never reached two, so a
    drift that retraining did not cure never alerted). At most `most` files read."""
    root = Path(directory)
    files = sorted(root.glob("*.json"), reverse=True)[:most] if root.is_dir() else []
    counts: dict[str, int] = {}
    ended: set[str] = set()
    seen_runs: set[str] = set()
    for path in files:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            run = data.get("run_id")
            if (this_run is not None and run == this_run) or (isinstance(run, str) and run in seen_runs):
                continue
            checked = {str(r["model"]): r.get("drifted") is True for r in data.get("reports")}
        except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError):
            break  # nothing after an unreadable record is known to follow on from this run
        if isinstance(run, str):
            seen_runs.add(run)
        for model, drifted in checked.items():
            if model in ended:
                continue
            if drifted:
                counts[model] = counts.get(model, 0) + 1
            else:
                ended.add(model)
    return counts


def safe_file_part(run_id: str) -> str:
    """A run id as part of a file name, from its start (its last 24 characters dropped `manual__2026` and left a
    name like `-12-07T165110.9869570000`)."""
    import re

    return re.sub(r"[^A-Za-z0-9._-]+", "_", run_id).strip("_")[:80] or "run"


def save_drift_history(directory: str | Path, run_id: str | None, reports: list[dict[str, Any]],
                       alert_to: str = "") -> Path:
    """Append this run's drift reports to the history the plugin shows; `alert_to`: who the alert already went
    to (the alert task records it with `send_alert_once` once the mail went)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
    path = out / f"{stamp}-{safe_file_part(run_id or 'manual')}.json"
    path.write_text(json.dumps({"run_id": run_id, "time": time.time(), "reports": reports,
                                "alert_sent_to": alert_to}, indent=2, default=str), encoding="utf-8")
    return path


def alert_sent_to(history: str | Path) -> str:
    """Who the alert of a drift history file went to ("" while it has not gone)."""
    return str(json.loads(Path(history).read_text(encoding="utf-8")).get("alert_sent_to") or "")


def record_alert_sent(history: str | Path, recipients: str) -> None:
    """Write into a drift history file who its alert went to (replaced whole: a reader never sees half)."""
    path = Path(history)
    data = json.loads(path.read_text(encoding="utf-8"))
    data["alert_sent_to"] = recipients
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(json.dumps(data, indent=2, default=str), encoding="utf-8")
    partial.replace(path)


def send_alert_once(history: str | Path, recipients: list[str], send: Callable[[], None]) -> bool:
    """Send a drift check's alert unless its history file says it went (a retry of the alert task, or the task
    cleared by hand, after the mail went), then record who it went to; False when it had gone already.

    The history said "sent" before the alert task ran, so a mail server that refused the alert left the drift
    page saying it had gone. At least once: a task killed between the send and the record sends it again."""
    if alert_sent_to(history):
        return False
    send()
    record_alert_sent(history, ", ".join(recipients))
    return True


def refused_for_bad_data(batch: dict[str, Any]) -> tuple[Path, str] | None:
    """The validation report beside `batch` and why it refused training, when it refused it for bad data (not too
    few rows); None otherwise, or when no report was written. The alert mails such a refusal: no drift check runs
    on a batch whose data failed its expectations."""
    path = Path(batch["jobs_path"]).parent / "validation.json"
    try:
        report = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(report, dict) or not report.get("refused") or report.get("too_few_rows"):
        return None
    return path, str(report["refused"])


def minimum_rows(suite: str) -> int:
    """The least row count the suite `suite` ("job_log", "throughput") accepts (0 when it sets none)."""
    from lucid_core.validation import suite_path

    data = json.loads(suite_path(suite).read_text(encoding="utf-8"))
    return next((int(e["kwargs"].get("min_value") or 0) for e in data["expectations"]
                 if e["type"] == "expect_table_row_count_to_be_between"), 0)


def training_status(update_dir: str | Path) -> str:
    """What the newest batch under `update_dir` (the Update Engine's reports/update) held against what
    training needs, for pages with too little data: e.g. "the last Update Engine run found 2 of 20 finished
    jobs and 1 of 12 10-minute submission slots (finetune window, 7 days): training waits for more".
    "" when no batch was extracted yet."""
    root = Path(update_dir)
    batches = sorted(root.glob("*/jobs.csv"), key=lambda p: p.stat().st_mtime) if root.is_dir() else []
    if not batches:
        return ""
    directory = batches[-1].parent
    window = ""
    try:
        report = json.loads((directory / "validation.json").read_text(encoding="utf-8"))
        jobs, slots = int(report["job_log"]["rows"]), int(report["throughput"]["rows"])
        batch = report["batch"]
        window = f" ({batch['mode']} window, {(batch['until'] - batch['since']) / 86400:.0f} days)"
    except (OSError, ValueError, KeyError, TypeError):
        jobs = len(read_batch_frame(directory / "jobs.csv"))
        slots = len(read_batch_frame(directory / "slots.csv")) if (directory / "slots.csv").is_file() else 0
    need_jobs, need_slots = minimum_rows("job_log"), minimum_rows("throughput")
    enough = jobs >= need_jobs and slots >= need_slots
    return (f"the last Update Engine run found {jobs} of {need_jobs} finished jobs and {slots} of {need_slots} "
            f"{SLOT_S / 60:.0f}-minute submission slots{window}: "
            + ("enough to train" if enough else "training waits for more"))
