"""What a DAG run's form or conf asks for, checked by its first task before any work: a key the DAG does not
take, a trace file outside the folders a run may read, a window with no file to cut it from. Airflow merges
conf into the params without a word about keys it does not know, so a typo ran with the default."""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any


def refuse_unknown_conf(conf: Mapping[str, Any] | None, known: Iterable[str]) -> None:
    """ValueError naming the first conf key that is no parameter of the DAG, with the closest one."""
    names = sorted(known)
    for key in sorted(conf or {}):
        if key in names:
            continue
        close = difflib.get_close_matches(key, names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ValueError(f"run conf key {key!r} is not a parameter of this DAG{hint}; it takes: {', '.join(names)}")


def refuse_non_finite(params: Mapping[str, Any]) -> None:
    """ValueError naming the first number parameter that is NaN or infinite, or an integer past a float's range:
    a form's schema checks ranges, and NaN passes every range check (`x > NaN` is never true), so a NaN
    threshold silently turned a check off."""
    from lucid_core.policy.view import saved_float

    for name in sorted(params):
        value = params[name]
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        if saved_float(value) is None:
            shown = "an integer past a float's range" if isinstance(value, int) else repr(value)
            raise ValueError(f"parameter {name!r} must be a finite number, got {shown}")


def trace_folders() -> list[Path]:
    """The folders a tuner run may read a trace from: LUCID_TRACES_DIR (several joined by the path separator),
    else LUCID_HOME/traces."""
    given = [Path(p) for p in os.environ.get("LUCID_TRACES_DIR", "").split(os.pathsep) if p]
    if given:
        return given
    from lucid_core.config import lucid_home

    return [lucid_home() / "traces"]


def checked_trace_path(path: str) -> Path:
    """`path` resolved, when it is a file inside one of `trace_folders`: a form field must not make the worker
    read, and echo into its log, whatever file it can (a secrets file, /proc/self/environ)."""
    resolved = Path(path).resolve()
    folders = [folder.resolve() for folder in trace_folders()]
    if not any(resolved.is_relative_to(folder) for folder in folders):
        raise ValueError(f"trace_path {path!r} is outside the folders tuner runs may read traces from "
                         f"({', '.join(map(str, folders))}; set LUCID_TRACES_DIR to change them)")
    if not resolved.is_file():
        raise ValueError(f"trace_path {path!r} is not a file")
    return resolved


def refuse_window_without_trace(params: Mapping[str, Any], conf: Mapping[str, Any] | None = None,
                                defaults: Mapping[str, Any] | None = None) -> None:
    """The inputs that choose how trace_path's file is read (window_start, window_end, trace_format) mean nothing
    without one, and window_days (the store's window) nothing with one: each was accepted and ignored. Airflow's
    trigger form sends every parameter's value, so window_days counts as given only where it differs from
    `defaults` (the DAG's own)."""
    if not params.get("trace_path"):
        given = [k for k in ("window_start", "window_end") if params.get(k)]
        if params.get("trace_format") not in (None, "", "auto"):
            given.append("trace_format")
        if given:
            raise ValueError(f"{' and '.join(given)} {'say' if len(given) > 1 else 'says'} how to read "
                             "trace_path's file, and no trace_path is given (the store's finished jobs of the last "
                             f"window_days are replayed): leave {'them' if len(given) > 1 else 'it'} out or give "
                             "trace_path")
    elif "window_days" in (conf or {}) and (conf or {})["window_days"] != (defaults or {}).get("window_days"):
        raise ValueError("window_days chooses how much of the store's history to replay, and trace_path is given "
                         "(its file is replayed, cut by window_start and window_end): leave one out")


def refuse_unreadable_window(params: Mapping[str, Any]) -> None:
    """window_start / window_end that are no ISO date or time, named as the form names them."""
    from lucid_core.sim.traces import as_window_time

    for name in ("window_start", "window_end"):
        if params.get(name):
            as_window_time(params[name], name)


def smtp_connection(conn_id: str) -> None:
    """ValueError when `conn_id` names no Airflow connection: the drift alert could reach nobody."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    try:
        BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:  # only "no such connection": a lookup that failed for a while is retried
        raise ValueError(f"smtp_conn_id {conn_id!r} names no Airflow connection the alert could be sent "
                         "through: add it, or give the one your SMTP server has") from None
