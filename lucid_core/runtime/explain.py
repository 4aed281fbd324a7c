"""`lucid explain`: why a job is where it is, from the store and the same models the round uses."""

from __future__ import annotations

import math
import re
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select

from lucid_core.config import LucidConfig
from lucid_core.domain import ACTIVE_RUN_STATES, ShareClass
from lucid_core.policy.orchestrator import ordering_rule
from lucid_core.policy.predictors import HistoryDurationPredictor, UtilizationRuleClassifier
from lucid_core.policy.view import saved_number
from lucid_core.runtime.pending import pending_text
from lucid_core.runtime.queries import shared_speeds
from lucid_core.runtime.schema import DecisionRow, JobEventRow, JobRow, RunRow
from lucid_core.runtime.store import Store
from lucid_core.runtime.view_builder import PolicyFactory, default_policy, job_of, load_snapshot


def _duration_terms(model: Any, job: Any) -> dict[str, Any]:
    """Per-term contributions when the model can give them, else what decided the prediction."""
    if callable(getattr(model, "features_of", None)) and callable(getattr(model, "explain", None)):
        try:  # the GA2M: contributions in log1p-seconds, expm1(intercept + sum) is its estimate
            exp = model.explain(model.features_of([job]))[0]
            return {"model": type(model).__name__, "space": "log1p seconds", "intercept": exp.intercept,
                    "estimate_s": math.expm1(exp.prediction), "terms": [[k, v] for k, v in exp.top(len(
                        exp.contributions))]}
        except Exception as exc:  # an explanation must never break `explain`
            return {"model": type(model).__name__, "error": str(exc)}
    for name in ("explain_one", "explain"):
        fn = getattr(model, name, None)
        if callable(fn):
            try:
                return {"model": type(model).__name__, "terms": fn(job)}
            except Exception as exc:  # an explanation must never break `explain`
                return {"model": type(model).__name__, "error": str(exc)}
    if isinstance(model, HistoryDurationPredictor):
        seconds, source = model.predict_one(job)
        return {"model": "HistoryDurationPredictor", "predicted_s": seconds, "terms": [[source, seconds]]}
    return {"model": type(model).__name__, "terms": []}


#: HistoryDurationPredictor's history keys, in words
_HISTORY_SCOPE = {"user-gpus": "of this user with this GPU count", "user": "of this user",
                  "gpus": "with this GPU count", "all": "of any user"}
_HISTORY_SOURCE = re.compile(r"^(?P<key>\S+) history \((?P<n>\d+) jobs(?P<rest>.*)\)$")


def duration_words(seconds: float) -> str:
    """A duration rounded for a person: 42 s, 12.5 min, 10.8 h."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def history_source_words(source: str, seconds: float) -> str:
    """`all history (1 jobs)` and 38815.1 s as `10.8 h from 1 finished job of any user`."""
    match = _HISTORY_SOURCE.match(source)
    if not match:
        return f"{duration_words(seconds)} ({source})"
    n = int(match["n"])
    scope = _HISTORY_SCOPE.get(match["key"], f"({match['key']})")
    rest = match["rest"].strip(" ,")
    return (f"{duration_words(seconds)} from {n} finished job{'' if n == 1 else 's'} {scope}"
            + (f" ({rest})" if rest else ""))


def explain_terms(duration: dict[str, Any]) -> list[str]:
    """The duration model's explanation as lines in words: history sources, or the GA2M's largest terms."""
    if not duration:
        return []
    if duration.get("error"):
        return [f"duration model {duration.get('model')}: no explanation ({duration['error']})"]
    terms = duration.get("terms") or []
    if duration.get("model") == "HistoryDurationPredictor":
        return [f"predicted {history_source_words(str(t[0]), float(t[1]))}" for t in terms
                if isinstance(t, list | tuple) and len(t) == 2]
    if duration.get("space") == "log1p seconds":
        lines = [f"duration model {duration.get('model')}: estimate {duration_words(duration['estimate_s'])}; "
                 "largest terms (x e^term on the duration):"]
        lines += [f"  {name}: {value:+.2f} (x{math.exp(value):.2f})" for name, value in terms[:6]]
        return lines
    return [f"duration term: {t}" for t in (terms if isinstance(terms, list) else [terms])]


def prediction_notes(model: Any, jobs: list[Any]) -> dict[str, str]:
    """What the round records when it predicts jobs' durations: the prediction and its source in words,
    so `explain` can later say what the decision used rather than what the model says now. A GA2M
    explains the whole batch in one call (a burst of new jobs must not cost one call each)."""
    jobs = [job for job in jobs if job.predicted_duration is not None]
    if not jobs:
        return {}
    if callable(getattr(model, "features_of", None)) and callable(getattr(model, "explain", None)):
        name = type(model).__name__
        try:
            explanations = model.explain(model.features_of(jobs))
        except Exception as exc:  # an explanation must never break the round
            return {job.job_id: f"predicted {duration_words(job.predicted_duration)} by {name} "
                                f"(no explanation: {exc})" for job in jobs}
        return {job.job_id: f"predicted {duration_words(job.predicted_duration)} by {name}; largest terms "
                            + ", ".join(f"{k} {v:+.2f}" for k, v in exp.top(3))
                for job, exp in zip(jobs, explanations, strict=True)}
    notes = {}
    for job in jobs:
        lines = [line.strip() for line in explain_terms(_duration_terms(model, job))] if model is not None else []
        if lines and lines[0].startswith("predicted "):  # the history predictor says it in one line
            notes[job.job_id] = lines[0]
        else:
            notes[job.job_id] = f"predicted {duration_words(job.predicted_duration)}" + (
                f" ({'; '.join(lines)})" if lines else "")
    return notes


def _packing_path(model: Any, job: Any) -> list[str]:
    if job.profile is None:
        return []
    for name in ("decision_path", "explain_one", "explain"):
        fn = getattr(model, name, None)
        if callable(fn):
            try:
                out = fn(job.profile)
                return list(out) if isinstance(out, list | tuple) else [str(out)]
            except Exception as exc:
                return [f"no path: {exc}"]
    if isinstance(model, UtilizationRuleClassifier):
        u = job.profile.gpu_util
        if u < model.tiny_below:
            return [f"gpu_util {u:.1f} < {model.tiny_below:g} -> Tiny"]
        if u < model.medium_below:
            return [f"gpu_util {u:.1f} >= {model.tiny_below:g}", f"gpu_util {u:.1f} < {model.medium_below:g} -> Medium"]
        return [f"gpu_util {u:.1f} >= {model.medium_below:g} -> Jumbo"]
    return []


def _sharing(row: JobRow, splits: list[DecisionRow], events: Any) -> dict[str, Any]:
    """Whether the job may share a GPU, and if not, the split that forbade it and what was measured."""
    if not row.no_share:
        return {"allowed": True}
    if not splits:
        return {"allowed": False, "why": "marked not to share"}
    split = splits[-1]
    partner = split.payload.get("partner") if split.job_id == row.job_id else split.job_id
    event = next((e.message for e in reversed(events) if e.kind == "Unpair"), "")
    measured = event.removeprefix(split.reason).strip(" ()").removeprefix("measured ") if event != split.reason else ""
    return {"allowed": False, "why": f"its pair with {partner} was split: {split.reason}",
            "split_at": split.time, "partner": partner, "measured": measured or None}


def shared_speed_line(shared: dict[str, Any] | None) -> str | None:
    """What `explain` says of a job sharing GPUs: its measured speed, when and from how many samples."""
    if shared is None:
        return None
    if shared["speed"] is None:
        return f"speed while shared with {shared['partner']}: not measured yet (the pair has not settled)"
    at = datetime.fromtimestamp(shared["measured_at"], UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    source = "emulated telemetry" if shared["emulated"] else "telemetry"
    return (f"speed while shared with {shared['partner']}: {shared['speed']:.2f} of its speed alone, measured "
            f"{at} ({shared['age_s']:.0f} s ago) over {shared['samples']} samples of {source}")


def explain(store: Store, job_id: str, config: LucidConfig, now: float,
            policy_factory: PolicyFactory | None = None) -> dict[str, Any]:
    with store.session() as s:
        row = s.get(JobRow, job_id)
        if row is None:
            raise KeyError(job_id)
        decisions = s.scalars(select(DecisionRow).where(DecisionRow.job_id == job_id).order_by(DecisionRow.id)).all()
        runs = s.scalars(select(RunRow).where(RunRow.job_id == job_id).order_by(RunRow.planned_at)).all()
        events = s.scalars(select(JobEventRow).where(JobEventRow.job_id == job_id).order_by(JobEventRow.id)).all()
        splits = [d for d in s.scalars(select(DecisionRow).where(DecisionRow.kind == "Unpair").order_by(DecisionRow.id))
                  if job_id in (d.job_id, d.payload.get("partner"))]
        shared = shared_speeds(s, [job_id]).get(job_id)
    snapshot = load_snapshot(store, now)
    policy = (policy_factory or default_policy)(config, snapshot)
    cap = snapshot.state.get("long_cap") if config.orchestrator.long_quantile < 1 else None
    job = job_of(row)
    parts = policy.describe()
    duration_model, packing_model = parts.duration_model, parts.packing_model
    partner_reason = None
    partner = None
    for d in decisions:
        if d.kind == "Place" and d.payload.get("partner"):
            partner, partner_reason = d.payload["partner"], d.reason
    active = [r for r in runs if r.state in ACTIVE_RUN_STATES]
    if active and active[0].partner:
        partner = active[0].partner
        if partner_reason is None:  # it started alone and the partner joined it: the partner's decision says why
            with store.session() as s:
                joined = s.scalars(select(DecisionRow).where(DecisionRow.job_id == partner,
                                                             DecisionRow.kind == "Place")
                                   .order_by(DecisionRow.id.desc())).first()
            if joined is not None and joined.payload.get("partner") == job_id:
                partner_reason = joined.reason
    placed = next((d for d in reversed(decisions) if d.kind == "Place"), None)
    rule, words = ordering_rule(job, now, config.orchestrator.guard_slowdown, config.profiler.tprof_s,
                                placed.reason if placed is not None else None,
                                (placed.payload or {}).get("partner") if placed is not None else None,
                                float(cap) if saved_number(cap) else math.inf)
    out: dict[str, Any] = {
        "job_id": job_id, "state": row.state, "name": row.name, "user": row.user, "vc": row.vc, "gpus": row.gpus,
        "submit_time": row.submit_time, "start_time": row.start_time, "end_time": row.end_time,
        "exit_code": row.exit_code, "end_reason": row.end_reason, "ended_in_profiling": row.ended_in_profiling,
        "priority": {
            "value_gpu_s": row.gpus * row.predicted_duration if row.predicted_duration is not None else None,
            "formula": "gpus x predicted duration (lower runs first)",
            "gpus": row.gpus, "predicted_duration_s": row.predicted_duration,
            "duration": _duration_terms(duration_model, job) if duration_model is not None else None,
            # the predicted duration the placement used, as the round recorded it then
            "recorded": next(({"time": e.time, "note": e.message} for e in reversed(events)
                              if e.kind == "Predicted"), None),
        },
        "ordered_by": {"rule": rule, "why": words},
        "profile": None if job.profile is None else {
            "gpu_util": job.profile.gpu_util, "mem_util": job.profile.mem_util,
            "gpu_mem_mb": job.profile.gpu_mem_mb, "emulated": job.profile.emulated},
        "packing": {
            "class": ShareClass(row.share_class).name if row.share_class is not None else None,
            "path": _packing_path(packing_model, job) if packing_model is not None else [],
        },
        "partner": {"job_id": partner, "why": partner_reason} if partner else None,
        "sharing": _sharing(row, splits, events),
        "shared": None if shared is None else {
            **asdict(shared), "age_s": None if shared.measured_at is None else max(0.0, now - shared.measured_at)},
        "pending": {"position": row.queue_position, "reason": pending_text(row)} if row.pending_reason else None,
        "runs": [{"run_id": r.run_id, "host": r.host, "kind": r.kind, "gpus": r.gpu_indices, "state": r.state,
                  "exit_code": r.exit_code, "outcome": r.outcome} for r in runs],
        "decisions": [{"time": d.time, "kind": d.kind, "reason": d.reason, "status": d.status} for d in decisions],
        "events": [{"time": e.time, "kind": e.kind, "message": e.message} for e in events],
        "models": parts.model_sources,
    }
    return out
