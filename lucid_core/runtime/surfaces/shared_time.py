"""When two jobs really shared a GPU: the one truth every surface reports (summary, explain, status, pages,
metrics). A placement beside a partner is a plan; the jobs shared only for the time both of their runs ran
on one host with a GPU in common, as the run records show (start and end of each run, or now for one still
running). A partner that ended inside its profiling window before the other started never shared."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lucid_core.policy.view import saved_float, saved_indices
from lucid_core.units import duration_words

if TYPE_CHECKING:  # SQLAlchemy only where a session is read: `lucid status` reads without it (plain_views)
    from sqlalchemy.orm import Session

    from lucid_core.runtime.store.schema import RunRow


@dataclass(frozen=True, slots=True)
class SharedSpan:
    """One stretch of time during which `job_id`'s run and `partner`'s run both ran on `gpus` of `host`."""

    job_id: str
    partner: str
    host: str
    gpus: tuple[int, ...]
    start: float
    end: float
    ongoing: bool  # both runs still run: `end` is the time of the read

    @property
    def seconds(self) -> float:
        """How long the two ran together."""
        return self.end - self.start


def overlap(a: RunRow, b: RunRow, now: float) -> SharedSpan | None:
    """The span during which runs `a` and `b` both ran on a common GPU of one host (None: they never did, or a
    stored time is not a number, text a hand edit left: then when they ran is not known)."""
    if a.host != b.host or a.started_at is None or b.started_at is None:
        return None
    common = set(saved_indices(a.gpu_indices)) & set(saved_indices(b.gpu_indices))
    if not common:
        return None
    times = [saved_float(t) if t is not None else now for t in (a.started_at, b.started_at, a.ended_at, b.ended_at)]
    if None in times:
        return None
    a_start, b_start, a_end, b_end = times
    start, end = max(a_start, b_start), min(a_end, b_end)
    if end <= start:
        return None
    return SharedSpan(a.job_id, b.job_id, a.host, tuple(sorted(common)), start, end,
                      a.ended_at is None and b.ended_at is None)


def spans_of_runs(runs: Iterable[RunRow], now: float) -> list[SharedSpan]:
    """Every span, seen from each side, between runs of which one names the other's job as its partner."""
    by_job: dict[str, list[RunRow]] = {}
    listed = list(runs)
    for run in listed:
        by_job.setdefault(run.job_id, []).append(run)
    seen: set[frozenset[tuple[str, str]]] = set()
    out: list[SharedSpan] = []
    for run in listed:
        if not run.partner or run.partner == run.job_id:
            continue
        for other in by_job.get(run.partner, []):
            key = frozenset({(run.run_id, run.host), (other.run_id, other.host)})
            if key in seen:
                continue
            seen.add(key)
            span = overlap(run, other, now)
            if span is not None:
                out += [span, SharedSpan(other.job_id, run.job_id, span.host, span.gpus, span.start, span.end,
                                         span.ongoing)]
    return sorted(out, key=lambda x: (x.start, x.job_id))


def spans_by_job(runs: Iterable[Any], now: float, job_ids: Sequence[str] | None = None,
                 ) -> dict[str, list[SharedSpan]]:
    """The spans each job (of `job_ids`, or all) really shared a GPU, from `runs`: the started runs of those
    jobs, of the jobs they name as partner, and of the jobs naming them."""
    out: dict[str, list[SharedSpan]] = {}
    for span in spans_of_runs(runs, now):
        if job_ids is None or span.job_id in job_ids:
            out.setdefault(span.job_id, []).append(span)
    return out


def shared_spans(session: Session, now: float, job_ids: Sequence[str] | None = None) -> dict[str, list[SharedSpan]]:
    """The spans each job (of `job_ids`, or all) really shared a GPU, from the run records."""
    from sqlalchemy import or_, select

    from lucid_core.runtime.store.schema import RunRow

    query = select(RunRow).where(RunRow.started_at.is_not(None))
    if job_ids is not None:
        wanted = list(job_ids)
        partners = select(RunRow.partner).where(RunRow.job_id.in_(wanted), RunRow.partner.is_not(None))
        query = query.where(or_(RunRow.job_id.in_(wanted), RunRow.partner.in_(wanted), RunRow.job_id.in_(partners)))
    return spans_by_job(session.scalars(query), now, job_ids)


def shared_pairs(session: Session, now: float) -> dict[tuple[str, str], float]:
    """Each pair of jobs that really shared a GPU (sorted ids) and the seconds they did."""
    out: dict[tuple[str, str], float] = {}
    for spans in shared_spans(session, now).values():
        for span in spans:
            if span.job_id < span.partner:
                key = (span.job_id, span.partner)
                out[key] = out.get(key, 0.0) + span.seconds
    return out


def shared_words(spans: Sequence[SharedSpan], planned_partner: str | None, ended: bool) -> str | None:
    """What a job's sharing was, in words: with whom, where, for how long; or that a planned partner never ran
    beside it (`ended`: the job has ended, so it never will). None: it never was placed to share."""
    if not spans:
        if planned_partner and ended:
            return f"placed to share with {planned_partner}, but the two never ran on one GPU at the same time"
        if planned_partner:
            return f"placed to share with {planned_partner}; the two have not run on one GPU together yet"
        return None
    parts = []
    for span in spans:
        gpus = ",".join(str(g) for g in span.gpus)
        state = " (still sharing)" if span.ongoing else ""
        parts.append(f"{span.partner} on {span.host} GPU {gpus} for {duration_words(span.seconds)}{state}")
    return "shared a GPU with " + "; ".join(parts)

