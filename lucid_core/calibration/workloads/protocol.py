"""The line protocol a workload process prints and the harness parses (torch-free)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

PREFIX = "LUCID_CALIB "


@dataclass(frozen=True)
class WorkloadResult:
    """One workload process's measured window: iterations per second over [measure_start, measure_end]."""

    workload: str
    batch_size: int
    amp: bool
    device: str
    iterations: int
    seconds: float
    iters_per_s: float
    samples_per_s: float
    measure_start: float
    measure_end: float
    torch_version: str
    gpu_name: str = ""
    tag: str = ""  # which process of a co-located pair printed it

    def to_line(self) -> str:
        return PREFIX + json.dumps({"event": "result", **asdict(self)}, sort_keys=True)


def progress_line(elapsed_s: float, iterations: int, iters_per_s: float) -> str:
    """A progress record printed about once a second while measuring."""
    payload = {"event": "progress", "t": round(elapsed_s, 3), "iters": iterations, "ips": round(iters_per_s, 3)}
    return PREFIX + json.dumps(payload, sort_keys=True)


def parse_events(text: str) -> list[dict[str, Any]]:
    """All protocol records (JSON objects) in a workload's output, in order; other lines are ignored."""
    events = []
    for line in text.splitlines():
        start = line.find(PREFIX)
        if start < 0:
            continue
        try:
            event = json.loads(line[start + len(PREFIX):])
        except (ValueError, RecursionError):  # not JSON, or an integer past Python's digit limit
            continue
        if isinstance(event, dict):  # a record is an object; anything else is no record
            events.append(event)
    return events


def parse_results(text: str) -> dict[str, WorkloadResult]:
    """Result records of a run's output by tag (the last one per tag wins); a record whose fields are not
    WorkloadResult's (missing, unknown, not an object) is no result: skipped, where it raised TypeError."""
    out = {}
    for event in parse_events(text):
        if event.get("event") == "result":
            try:
                result = WorkloadResult(**{k: v for k, v in event.items() if k != "event"})
            except TypeError:
                continue
            if isinstance(result.tag, str):
                out[result.tag] = result
    return out


def parse_result(text: str, tag: str = "") -> WorkloadResult:
    """The result record of one process (by tag); ValueError naming the output's tail if absent."""
    results = parse_results(text)
    if tag not in results:
        tail = "\n".join(text.strip().splitlines()[-5:])
        who = f"workload {tag}" if tag else "workload"
        raise ValueError(f"{who} printed no result line; last output:\n{tail}")
    return results[tag]
