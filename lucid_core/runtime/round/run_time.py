"""How long a job has run: its runs' spans added up (what its time limit counts, and what `lucid history` and
`lucid status` show as its run time). Plain records, no SQLAlchemy: the CLI's plain reads use it too."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from lucid_core.domain import ACTIVE_RUN_STATES
from lucid_core.policy.view import saved_float


def time_run(runs: Iterable[Any], now: float) -> float:
    """Seconds a job's runs have run: per run, from its first node's start to its last node's end (now while
    a node still runs). Times another writer broke (text, infinite, before the start) count as nothing."""
    spans: dict[str, list[float]] = {}
    for run in runs:
        start = saved_float(run.started_at)
        if start is None or start > now:
            continue
        end = now if run.state in ACTIVE_RUN_STATES else saved_float(run.ended_at)
        if end is None:
            continue
        span = spans.setdefault(run.run_id, [start, end])
        span[0], span[1] = min(span[0], start), max(span[1], end)
    return sum(max(0.0, min(end, now) - start) for start, end in spans.values())
