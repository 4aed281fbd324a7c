"""`lucid explain`: why a job is where it is, from the store and the same models the round uses."""

from __future__ import annotations

import math
from dataclasses import asdict
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select

from lucid_core.config import LucidConfig
from lucid_core.domain import ACTIVE_RUN_STATES, Pool, ShareClass
from lucid_core.policy.orchestrator import ordering_rule
from lucid_core.policy.predictors import UtilizationRuleClassifier
from lucid_core.policy.view import saved_number
from lucid_core.runtime.round.live_models import PolicyFactory, default_policy, host_sharing
from lucid_core.runtime.round.pending import pending_text
from lucid_core.runtime.round.prediction_words import (
    duration_terms,
)
from lucid_core.runtime.round.snapshot import job_of, load_snapshot
from lucid_core.runtime.store.schema import DecisionRow, JobEventRow, JobRow, RunRow
from lucid_core.runtime.store.store import Store
from lucid_core.runtime.surfaces.job_views import FINISHED_STATES, stopping_words
from lucid_core.runtime.surfaces.queries import shared_speeds
from lucid_core.runtime.surfaces.shared_time import shared_spans, shared_words


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


def _packing_by_host(policy: Any, hosts: list[Any], job: Any) -> list[dict[str, Any]]:
    """The job's class on each kind of main host of its VC (GPU model and mechanism), or why none applies."""
    models = getattr(getattr(policy, "binder", None), "packing_models", None)
    if models is None:
        return []
    mine = [h for h in hosts if h.pool == Pool.MAIN.value and h.vc == job.vc] or [
        h for h in hosts if h.pool == Pool.MAIN.value]
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for host in mine:
        sharing = host_sharing(host)
        entry = out.setdefault((sharing.key, sharing.mechanism, sharing.emulated), {
            "sharing": sharing.key.describe() if sharing.key is not None else f"unknown GPU model, {sharing.mechanism}",
            "emulated": sharing.emulated, "hosts": []})
        entry["hosts"].append(host.name)
        if "class" not in entry:
            model = models.model_for(sharing)
            klass = None if model is None or job.profile is None else model.classify([job.profile])[0]
            entry["class"] = klass.name if klass is not None else None
            entry["path"] = _packing_path(model, job) if model is not None else []
            entry["why"] = models.why_not(sharing) if model is None else None
    return list(out.values())


def _sharing(row: JobRow, splits: list[DecisionRow], events: Any) -> dict[str, Any]:
    """Whether the job may share a GPU, and if not, the split that forbade it and what was measured."""
    if not row.no_share:
        return {"allowed": True}
    if not splits:
        return {"allowed": False, "why": "marked not to share"}
    split = splits[-1]
    partner = _payload(split).get("partner") if split.job_id == row.job_id else split.job_id
    event = next((e.message for e in reversed(events) if e.kind == "Unpair"), "")
    measured = event.removeprefix(split.reason).strip(" ()").removeprefix("measured ") if event != split.reason else ""
    return {"allowed": False, "why": f"its pair with {partner} was split: {split.reason}",
            "split_at": split.time, "partner": partner, "measured": measured or None}


def _payload(decision: Any) -> dict[str, Any]:
    """A decision's stored payload as a mapping; {} for anything else (JSON a hand edit left unparseable reads as
    None)."""
    return decision.payload if isinstance(decision.payload, dict) else {}


def shared_speed_line(shared: dict[str, Any] | None) -> str | None:
    """What `explain` says of a job sharing GPUs: its measured speed, when and from how many samples."""
    if shared is None:
        return None
    if shared["speed"] is None:
        return f"speed while shared with {shared['partner']}: not measured yet (the pair has not settled)"
    source = "emulated telemetry" if shared["emulated"] else "telemetry"
    if shared["measured_at"] is None:  # a time a hand edit left unreadable: the speed, without when
        when = "at a time the store holds unreadable"
    else:
        at = datetime.fromtimestamp(shared["measured_at"], UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        when = f"{at} ({shared['age_s']:.0f} s ago)"
    return (f"speed while shared with {shared['partner']}: {shared['speed']:.2f} of its speed alone, measured "
            f"{when} over {shared['samples']} samples of {source}")


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
                  if job_id in (d.job_id, _payload(d).get("partner"))]
        shared = shared_speeds(s, [job_id]).get(job_id)
        spans = shared_spans(s, now, [job_id]).get(job_id, [])
    snapshot = load_snapshot(store, now)
    policy = (policy_factory or default_policy)(config, snapshot)
    cap = snapshot.state.get("long_cap") if config.orchestrator.long_quantile < 1 else None
    try:
        job = job_of(row)
    except (TypeError, ValueError) as exc:  # as the round says it: the job is left out until its row is mended
        raise ValueError(f"its stored row cannot be read ({exc})") from exc
    parts = policy.describe()
    duration_model, packing_model = parts.duration_model, parts.packing_model
    partner_reason = None
    partner = None
    for d in decisions:
        if d.kind == "Place" and _payload(d).get("partner"):
            partner, partner_reason = _payload(d)["partner"], d.reason
    active = [r for r in runs if r.state in ACTIVE_RUN_STATES]
    if active and active[0].partner:
        partner = active[0].partner
        if partner_reason is None:  # it started alone and the partner joined it: the partner's decision says why
            with store.session() as s:
                joined = s.scalars(select(DecisionRow).where(DecisionRow.job_id == partner,
                                                             DecisionRow.kind == "Place")
                                   .order_by(DecisionRow.id.desc())).first()
            if joined is not None and _payload(joined).get("partner") == job_id:  # in the partner's own words
                partner_reason = f"{partner} was placed beside it (the round's words for {partner}: {joined.reason})"
    if partner is None:  # no decision of its own named one: the run records still may (it was joined)
        partner = next((r.partner for r in reversed(runs) if r.partner), None)
    by_host = _packing_by_host(policy, snapshot.hosts, job)  # the first: the first kind of host it may run on
    placed = next((d for d in reversed(decisions) if d.kind == "Place"), None)
    rule, words = ordering_rule(job, now, config.orchestrator.guard_slowdown, config.profiler.tprof_s,
                                placed.reason if placed is not None else None,
                                _payload(placed).get("partner") if placed is not None else None,
                                float(cap) if saved_number(cap) else math.inf)
    if job.predicted_duration is None and (placed is not None or row.state in FINISHED_STATES):
        # the rule's words are for a job still waiting for its estimate; this one started or ended without one
        words = (f"never ordered by predicted GPU-time: placed before it had a duration estimate ({placed.reason})"
                 if placed is not None else "never ordered: it ended before it joined the main queue")
    out: dict[str, Any] = {
        "job_id": job_id, "state": row.state, "name": row.name, "user": row.user, "vc": row.vc, "gpus": row.gpus,
        "submit_time": row.submit_time, "start_time": row.start_time, "end_time": row.end_time,
        "exit_code": row.exit_code, "end_reason": row.end_reason, "ended_in_profiling": row.ended_in_profiling,
        "priority": {
            "value_gpu_s": row.gpus * row.predicted_duration if row.predicted_duration is not None else None,
            "formula": "gpus x predicted duration (lower runs first)",
            "gpus": row.gpus, "predicted_duration_s": row.predicted_duration,
            # its --time-limit (None: none): no prediction passes it, since the round stops the job there
            "time_limit_s": job.time_limit_s,
            "duration": duration_terms(duration_model, job) if duration_model is not None else None,
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
            "path": (by_host[0]["path"] if by_host else
                     _packing_path(packing_model, job) if packing_model is not None else []),
            "by_host": by_host,
        },
        # the partner it was placed beside; `sharing_now`: both run on its GPUs now (the run records say so)
        "partner": {"job_id": partner, "why": partner_reason,
                    "sharing_now": any(x.ongoing and x.partner == partner for x in spans)} if partner else None,
        # when it really shared a GPU, from the run records (a partner that never ran beside it: none)
        "shared_spans": [{**asdict(x), "seconds": x.seconds} for x in spans],
        "shared_time": shared_words(spans, partner, row.state in FINISHED_STATES),
        "sharing": _sharing(row, splits, events),
        "shared": None if shared is None else {
            **asdict(shared), "age_s": None if shared.measured_at is None else max(0.0, now - shared.measured_at)},
        "pending": {"position": row.queue_position, "reason": pending_text(row)} if row.pending_reason else None,
        "runs": [{"run_id": r.run_id, "host": r.host, "kind": r.kind, "gpus": r.gpu_indices, "state": r.state,
                  "exit_code": r.exit_code, "outcome": r.outcome, "stopping": stopping_words(r)} for r in runs],
        "decisions": [{"time": d.time, "kind": d.kind, "reason": d.reason, "status": d.status} for d in decisions],
        "events": [{"time": e.time, "kind": e.kind, "message": e.message} for e in events],
        "models": parts.model_sources,
    }
    return out
