"""Where the tuner reads its history and keeps its reports, from the DAG run's params and the environment."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def reports_root() -> Path:
    """LUCID_REPORTS_DIR, else LUCID_HOME/reports: shared by the workers and the plugin."""
    if os.environ.get("LUCID_REPORTS_DIR"):
        return Path(os.environ["LUCID_REPORTS_DIR"])
    from lucid_core.config import lucid_home

    return lucid_home() / "reports"


def safe_name(run_id: str) -> str:
    """A run id as a directory name (run ids carry ':' and '+')."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", run_id).strip("_") or "run"


def report_directory(run_id: str) -> Path:
    return reports_root() / "tuner" / safe_name(run_id)


def tuner_window(params: Mapping[str, Any]) -> dict[str, float] | None:
    """The store window a sweep replays, fixed once for every mapped task (None for a trace file): the jobs
    submitted and finished in [since, until). Each task computing its own "now" replayed a different job set
    when a job finished between two tasks, so the configurations were not compared on the same jobs."""
    if params.get("trace_path"):
        return None
    from lucid_airflow.connections import store_url
    from lucid_core.update import store_time

    until = store_time(store_url())
    return {"since": until - float(params.get("window_days", 7)) * 86400.0, "until": until}


class NothingToReplay(ValueError):
    """The store window holds no finished job at all: a quiet week, for the DAG to skip the run on (a window of only
    jobs the simulator cannot replay is a plain ValueError: data to look at, not a week to skip)."""


def utc_text(stamp: float) -> str:
    """A time for messages, in UTC and saying so: time.ctime gave the worker's local time with no zone."""
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(stamp))


def load_tuner_trace(params: Mapping[str, Any], window: Mapping[str, float] | None = None):
    """The trace records a sweep replays: a file window, or the store's finished jobs of `window` (by default
    the last window_days up to now). NothingToReplay when the store window holds no finished job."""
    if params.get("trace_path"):
        from lucid_airflow.run_inputs import checked_trace_path
        from lucid_core.sim.traces import read_trace

        trace = read_trace(checked_trace_path(params["trace_path"]), params.get("trace_format") or "auto",
                           params.get("window_start") or None, params.get("window_end") or None)
        return trace.records
    from lucid_airflow.connections import store_url
    from lucid_core.tuner import records_from_jobs
    from lucid_core.update import extract_job_log

    window = window or tuner_window(params)
    since, until = float(window["since"]), float(window["until"])
    frame = extract_job_log(store_url(), since=since, until=until)
    frame = frame[frame["end_time"] < until]  # finished by the window's end: the same jobs for every task
    records = records_from_jobs(frame.to_dict("records"))
    if not records:
        odd = getattr(records, "odd_jobs", 0)
        if odd:  # finished jobs there were, but none the simulator can replay: say so, not "none"
            from lucid_core.tuner import odd_jobs_text

            raise ValueError(f"no finished job since {utc_text(since)} can be replayed: {odd_jobs_text(odd)}")
        raise NothingToReplay(f"the store has no finished job since {utc_text(since)}: nothing to replay")
    return records


def current_config():
    """The configuration the live scheduler runs with (the live config file when there is one)."""
    from lucid_core.config import load_live_config

    return load_live_config()


def tuner_fleet(params: Mapping[str, Any]) -> dict[str, Any] | None:
    """The fleet a sweep simulates, as JSON: the store's inventory unless the form gives `main_nodes`."""
    if params.get("main_nodes"):
        return None
    from lucid_airflow.connections import store_url
    from lucid_core.tuner import inventory_fleet

    return inventory_fleet(store_url()).to_dict()


def tuner_settings(params: Mapping[str, Any], fleet: Mapping[str, Any] | None):
    """The sweep's settings from the form and the fleet snapshot `tuner_fleet` took."""
    from lucid_core.sim.fleet import Fleet
    from lucid_core.tuner import TunerSettings

    return TunerSettings(main_nodes=params.get("main_nodes") or None, objective=params["objective"],
                         fleet=Fleet.from_dict(fleet) if fleet else None)


APPLIED_FILE = "applied.json"  # beside a tuner run's report.json: whether its proposal was written to the live config


def record_applied(directory: str | Path, path: str | None, why: str) -> None:
    """Say in the run's report directory whether its proposal changed the live config (`path`: the file written,
    None when nothing was), so the report pages tell an applied proposal from one only proposed."""
    import json

    target = Path(directory) / APPLIED_FILE
    target.write_text(json.dumps({"applied": path is not None, "path": path, "why": why, "time": time.time()}),
                      encoding="utf-8")
