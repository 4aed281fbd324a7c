"""Which jobs share GPUs now, read from their run rows: one rule for the round's pair-speed step and for every
reader. A row is anything with RunRow's columns (an ORM row, or a plain read's record); no SQLAlchemy here."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from lucid_core.domain import RunState


def mutual_pairs(runs: Iterable[Any]) -> list[tuple[Any, Any]]:
    """Rank-0 main runs of two jobs sharing GPUs now: both running, each naming the other; each pair
    once (lower job id first)."""
    main = {r.job_id: r for r in runs if r.kind == "main" and r.node_rank == 0 and r.state == RunState.RUNNING}
    return [(run, main[run.partner]) for job_id, run in sorted(main.items())
            if run.partner in main and main[run.partner].partner == job_id and job_id < run.partner]
