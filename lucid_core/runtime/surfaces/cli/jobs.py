"""`lucid` job commands: submit, cancel, queue, history, status, explain, eta (logs: `cli.logs`).

Each takes the parsed arguments (`runtime.cli`) and returns the exit code; expected errors are raised
(see `runtime.cli`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, TypeVar

from lucid_core.runtime.surfaces.cli.context import (
    config_of,
    emit,
    read_store,
    refuse,
    store_of,
)
from lucid_core.runtime.surfaces.history_table import (
    STATE_ALIASES,
    history_columns,
    history_lines,
    local_time,
    parse_since,
)
from lucid_core.runtime.surfaces.terminal_text import fit
from lucid_core.units import gpu_time_words

if TYPE_CHECKING:
    from lucid_core.runtime.store.store import Store

T = TypeVar("T")


def cmd_submit(args: argparse.Namespace) -> int:
    from lucid_core.runtime.surfaces.submission import JobRequest, SubmissionError, only_vc, submit

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    env = {}
    for item in args.env or []:
        key, sep, value = item.partition("=")
        if not sep:
            print(f"lucid submit: error: --env {item!r} must look like NAME=VALUE", file=sys.stderr)
            return 2
        env[key] = value
    store = store_of(args)
    request = JobRequest(command=command, gpus=args.gpus, user=args.user, vc=args.vc or only_vc(store, "--vc"),
                         name=args.name, amp=args.amp, long_cold_start=args.long_cold_start,
                         preemptible=args.preemptible, env=env, workload=args.workload,
                         time_limit_s=args.time_limit_s)
    try:
        job_id = submit(store, request)
    except SubmissionError as exc:
        return refuse(args, "lucid submit: error: " + "; ".join(f"{field}: {problem}"
                                                               for field, problem in exc.errors.items()))
    emit(args, {"job_id": job_id}, job_id)
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    """Cancel the jobs named, or the waiting and running jobs of the users named that the filters select (as
    `scancel -u`); with both, the named jobs the filters select (the others are said to be left). Each job is
    said in its own line; an unknown id fails alone (exit 2)."""
    import getpass

    from lucid_core.runtime.surfaces.job_views import QueueQuery, UnknownJob
    from lucid_core.runtime.surfaces.queries import queue, status
    from lucid_core.runtime.surfaces.submission import request_cancel

    query = QueueQuery.of_text(users=_users(args), vcs=args.vc,
                               states=args.state)
    if not args.jobs and not query.narrows:
        raise ValueError("name the jobs to cancel, or select them with --user, --me, --vc or --state")
    if not args.jobs and not query.users:  # scancel -t PD reaches a user's own jobs: say whose
        raise ValueError("--vc and --state alone would cancel every user's jobs: say whose with --me or "
                         "--user USER[,USER...]")
    store = store_of(args)
    matching = {r["job_id"] for r in queue(store, query)} if query.narrows else set()
    selected = list(dict.fromkeys(args.jobs)) if args.jobs else sorted(matching)
    answers, unknown = [], []
    for job_id in selected:
        try:
            if query.narrows and job_id not in matching:  # named, but not what the filters select: left
                state = status(store, job_id)["state"]
                answers.append(({"job_id": job_id, "state": state, "outcome": "not_selected"},
                                f"{job_id}: left ({state}): not selected by the filters given"))
                continue
            answer = request_cancel(store, job_id, message=f"cancel requested by {getpass.getuser()} (lucid cancel)")
        except UnknownJob:
            unknown.append(job_id)
            continue
        text = {"ended": f"{job_id} already ended ({answer.state}): nothing to cancel",
                "already_requested": f"{job_id}: cancel was already requested (state {answer.state}); the next "
                                     "round stops it",
                "requested": f"{job_id}: cancel requested (state {answer.state}); the next round stops it"}
        answers.append(({"job_id": job_id, "state": answer.state, "outcome": answer.outcome}, text[answer.outcome]))
    if len(args.jobs) == 1 and not query.narrows and answers:
        emit(args, answers[0][0], answers[0][1])  # one job named: one object, as before
    elif answers or not unknown:
        emit(args, [data for data, _ in answers],
             "\n".join(text for _, text in answers) or "no waiting or running job matches: nothing to cancel")
    if unknown:
        return refuse(args, "lucid cancel: error: " + "; ".join(f"no job {job_id!r}" for job_id in unknown))
    return 0


def _users(args: argparse.Namespace) -> str:
    """The users of `-u` (comma-separated) and, with `--me`, the user running the command."""
    import getpass

    return ",".join(x for x in (args.user, getpass.getuser() if args.me else None) if x)


def cmd_queue(args: argparse.Namespace) -> int:
    from lucid_core.runtime.surfaces import plain_views
    from lucid_core.runtime.surfaces.job_views import QueueQuery

    query = QueueQuery.of_text(users=_users(args), vcs=args.vc,
                               states=args.state)

    def full(store: Store) -> list[dict[str, Any]]:
        from lucid_core.runtime.surfaces.queries import queue

        return queue(store, query, priority_in_reason=args.as_json)

    rows = read_store(args, lambda reader: plain_views.queue(reader, query, priority_in_reason=args.as_json),
                      full)
    # the text has a PRIORITY column: its reasons leave the priority out
    lines = [f"{'JOB':<10} {'NAME':<24} {'USER':<10} {'VC':<10} {'STATE':<10} {'POS':>4} {'GPUS':>4} "
             f"{'PRED':>9} {'PRIORITY':>12}  REASON"]
    for r in rows:
        pred = "-" if r["predicted_duration_s"] is None else _duration(r["predicted_duration_s"])
        prio = "-" if r["priority_gpu_s"] is None else gpu_time_words(r["priority_gpu_s"])
        lines.append(f"{r['job_id']:<10} {fit(r['name'] or '-', 24)} {fit(r['user'], 10)} "
                     f"{fit(r['vc'], 10)} {r['state']:<10} {r['position'] or '-':>4} {r['gpus']:>4} {pred:>9} "
                     f"{prio:>12}  {r['pending_reason'] or ''}")
    empty = "no running or waiting job" + (" matches" if query.narrows else "") + " (finished ones: lucid history)"
    emit(args, rows, "\n".join(lines) if rows else empty)
    return 0


def _duration(seconds: float | None) -> str:
    """A duration rounded for a person: 42 s, 12.5 min, 10.8 h; '-' for none, `UNREADABLE` for text a hand
    edit left in the store (it failed `lucid queue` whole)."""
    from lucid_core.policy.view import saved_float
    from lucid_core.runtime.surfaces.history_table import UNREADABLE
    from lucid_core.units import duration_words

    if seconds is None:
        return "-"
    number = saved_float(seconds)
    return UNREADABLE if number is None else duration_words(number)


def cmd_history(args: argparse.Namespace) -> int:
    from lucid_core.runtime.surfaces import plain_views
    from lucid_core.runtime.surfaces.job_views import HistoryPage, HistoryQuery

    states = tuple(STATE_ALIASES.get(s.strip().upper(), s.strip().upper())
                   for s in (args.state or "").split(",") if s.strip())
    fields = history_columns(args.format)
    args.user = _users(args) or None  # as queue and cancel take them

    def query_at(now: float) -> HistoryQuery:
        """The query of the options, its ages (--since 2h) counted back from the store's `now`."""
        return HistoryQuery(user=args.user, vc=args.vc, states=states,
                            since=parse_since(args.since, now) if args.since else None,
                            until=parse_since(args.until, now) if args.until else None,
                            limit=args.limit, offset=args.offset)

    def full(store: Store) -> HistoryPage:
        from lucid_core.runtime.surfaces.queries import history

        query = query_at(store.now())
        with store.session() as session:
            return history(session, query)

    page = read_store(args, lambda reader: plain_views.history(reader, query_at(reader.now())), full)
    query = page.query
    if args.as_json:
        emit(args, {"total": page.total, "offset": query.offset, "jobs": page.rows}, "")
        return 0
    if not page.rows:
        print("no finished job matches" + (" (the store has none yet)" if not page.total and not (
            args.user or args.vc or states or args.since or args.until) else ""))
        return 0
    lines = history_lines(fields, page.rows)
    shown = f"{query.offset + 1}-{query.offset + len(page.rows)} of {page.total}"
    more = f"; next page: --offset {query.offset + len(page.rows)}" if query.offset + len(page.rows) < page.total \
        else ""
    print("\n".join(lines) + f"\n({shown} finished jobs, latest end first{more})")
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from lucid_core.runtime.surfaces import plain_views

    def full(store: Store) -> dict[str, Any]:
        from lucid_core.runtime.surfaces.queries import status

        return status(store, args.job)

    data = read_store(args, lambda reader: plain_views.status(reader, args.job), full)
    exit_code = "" if data["exit_code"] is None else f"  exit code {data['exit_code']}"
    text = "\n".join([
        f"{data['job_id']} {data['state']}  {data['name'] or '(no name)'}  {data['gpus']} GPU(s)  user {data['user']}  "
        f"VC {data['vc']}",
        f"submitted {local_time(data['submit_time'])}  started {_started(data)}  "
        f"ended {local_time(data['end_time'])}{exit_code}{_ran(data)}",
        *(f"  run {r['run_id']} on {r['host']} GPUs {r['gpus']}: {r['state']} {_run_note(r)}" for r in data["runs"]),
        *([data["sharing"]] if data["sharing"] else []),
        *([f"time limit: {_duration(data['time_limit_s'])}, all its runs together"]
          if data.get("time_limit_s") is not None else []),
        *([f"waiting: {data['pending_reason']}"] if data["pending_reason"] else []),
        *([f"end: {data['end_reason']}"] if data["end_reason"] else []),
    ])
    emit(args, data, text)
    return 0


def _started(data: dict[str, Any]) -> str:
    """When a job started, as `lucid history` says it (its first start on the main cluster), with its latest
    run's start after a yield."""
    first, latest = data.get("first_start_time"), data["start_time"]
    if first is None or latest is None or local_time(first) == local_time(latest):
        return local_time(latest)
    return f"{local_time(first)} (its latest run {local_time(latest)})"


def _ran(data: dict[str, Any]) -> str:
    """Its runs' time in all, when it has run (what its time limit counts)."""
    ran = data.get("ran_s")
    return f"  ran {_duration(ran)} in all" if isinstance(ran, float | int) and ran > 0 else ""


def _run_note(run: dict[str, Any]) -> str:
    """What `lucid status` says after a run's state: why it is being stopped, else its outcome."""
    note = f"({run['stopping']})" if run["stopping"] else run["outcome"] or ""
    return f"{note} [{run['host_down']}]".strip() if run.get("host_down") else note


def cmd_explain(args: argparse.Namespace) -> int:
    from lucid_core.policy.view import saved_float
    from lucid_core.runtime.round.prediction_words import explain_terms
    from lucid_core.runtime.surfaces.explain import explain, shared_speed_line
    from lucid_core.runtime.surfaces.job_views import FINISHED_STATES

    data = _about_job(args, explain)
    prio = data["priority"]
    lines = [f"{data['job_id']} {data['state']}: {data['gpus']} GPU(s), user {data['user']}, VC {data['vc']}"]
    if data["state"] in FINISHED_STATES and data.get("end_reason"):  # how it ended, before why it ran where
        lines.append(f"ended {local_time(data['end_time'])}: {data['end_reason']}")
    if prio["predicted_duration_s"] is not None:
        lines.append(f"priority {gpu_time_words(prio['value_gpu_s'])} = {prio['gpus']} GPU(s) x predicted "
                     f"{_duration(prio['predicted_duration_s'])}")
        predicted, limit = saved_float(prio["predicted_duration_s"]), prio.get("time_limit_s")
        if limit is not None and predicted is not None and predicted >= limit:
            lines.append(f"  predicted no longer than its time limit of {_duration(prio['time_limit_s'])} "
                         "(--time-limit): it is stopped there")
    if data.get("ordered_by"):
        why = data["ordered_by"]["why"]
        lines.append(why if why.startswith(("not ordered", "never ordered")) else f"ordered by {why}")
    recorded = prio.get("recorded")
    if recorded:
        lines.append(f"  used when placed ({local_time(recorded['time'])}): {recorded['note']}")
    now_says = explain_terms(prio.get("duration") or {})
    if now_says and not (recorded and len(now_says) == 1 and now_says[0] in recorded["note"]):
        lines.append("  the duration model now says:" if recorded else "  the duration model says:")
        lines += [f"    {line}" for line in now_says]
    packing = data["packing"]
    by_host = packing.get("by_host") or []
    if len(by_host) == 1 and by_host[0]["class"]:  # the class its host's model gives, with that model's path
        stored = packing["class"]
        lines.append(f"packing class {by_host[0]['class']}: " + " / ".join(by_host[0]["path"])
                     + (f" (it was classed {stored} when profiled)" if stored and stored != by_host[0]["class"]
                        else ""))
    elif packing["class"] and not by_host:
        lines.append(f"packing class {packing['class']}: " + " / ".join(packing["path"]))
    for kind in by_host if len(by_host) > 1 or any(k["class"] is None for k in by_host) else []:
        hosts = ", ".join(kind["hosts"][:3]) + (" ..." if len(kind["hosts"]) > 3 else "")
        says = (f"class {kind['class']}: " + " / ".join(kind["path"]) if kind["class"] else
                f"shares nothing: {kind['why']}" if kind["why"] else
                "never profiled" if data["state"] in FINISHED_STATES else "not profiled yet")
        lines.append(f"on {kind['sharing']} ({hosts}): {says}")
    if data["partner"]:
        partner = data["partner"]
        why = f": {partner['why']}" if partner["why"] else ""
        lines.append(f"{'shares with' if partner['sharing_now'] else 'placed beside'} {partner['job_id']}{why}")
    if data["shared_time"]:
        lines.append(data["shared_time"])
    if data["shared"]:
        lines.append(shared_speed_line(data["shared"]))
    sharing = data["sharing"]
    if not sharing["allowed"]:
        lines.append(f"may not share a GPU: {sharing['why']}")
        if sharing.get("measured"):
            lines.append(f"  {sharing['measured']}")
    if data["pending"]:
        lines.append(f"waiting (position {data['pending']['position']}): {data['pending']['reason']}")
    if (data.get("models") or {}).get("refused"):
        lines.append(f"promoted model not used: {data['models']['refused']}")
    for d in data["decisions"]:
        lines.append(f"  {local_time(d['time'])} {d['kind']} [{d['status']}]: {d['reason']}")
    emit(args, data, "\n".join(lines))
    return 0


def cmd_eta(args: argparse.Namespace) -> int:
    from lucid_core.runtime.surfaces.eta import estimate

    eta = _about_job(args, estimate)
    emit(args, asdict(eta),
           f"{eta.job_id} {eta.state}: start {local_time(eta.start)}, end {local_time(eta.end)} ({eta.note})")
    return 0


def _about_job(args: argparse.Namespace, answer: Callable[[Any, str, Any, float], T]) -> T:
    """`answer(store, job, config, now)` for --job; an unknown job is the CLI's UnknownJob error."""
    from lucid_core.runtime.surfaces.submission import UnknownJob

    try:
        store = store_of(args)
        return answer(store, args.job, config_of(args), store.now())
    except KeyError:
        raise UnknownJob(args.job) from None
