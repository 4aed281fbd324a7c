"""`lucid` subcommands of the live scheduler: submit, cancel, queue, history, status, logs, explain, eta, hosts,
round.

Expected errors (an unknown job, a bad value, an unreachable host) are raised and said in one line by
`lucid_core.cli.main` (exit 2); a command returns 1 only for a check that ran and found a problem.

`add_parser(subparsers)` registers them on the main `lucid` parser; each sets `func(args) -> int`.
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
import time
from dataclasses import asdict
from typing import Any

from lucid_core.config import load_live_config
from lucid_core.runtime.history_table import STATE_ALIASES, history_columns, history_lines, local_time, parse_since


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", dest="store_url", default=None,
                   help="store URL (default: LUCID_STORE_URL, else SQLite in LUCID_HOME)")
    p.add_argument("--config", "--lucid-config", dest="config", default=None,
                   help="config file, TOML or YAML (default: LUCID_CONFIG, else LUCID_HOME/lucid.toml if it exists)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KNOB=VALUE", help="override a knob")
    p.add_argument("--json", dest="as_json", action="store_true", help="print JSON")


def _store(args: argparse.Namespace) -> Any:
    from lucid_core.runtime.store import open_store

    return open_store(args.store_url)


def _print(args: argparse.Namespace, data: Any, text: str) -> None:
    print(json.dumps(data, indent=2, default=str) if args.as_json else text)


def _submit(args: argparse.Namespace) -> int:
    from lucid_core.runtime.submission import JobRequest, SubmissionError, submit

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
    request = JobRequest(command=command, gpus=args.gpus, user=args.user, vc=args.vc, name=args.name, amp=args.amp,
                         long_cold_start=args.long_cold_start, preemptible=args.preemptible, env=env,
                         workload=args.workload)
    try:
        job_id = submit(_store(args), request)
    except SubmissionError as exc:
        print("lucid submit: error: " + "; ".join(f"{field}: {problem}" for field, problem in exc.errors.items()),
              file=sys.stderr)
        return 2
    _print(args, {"job_id": job_id}, job_id)
    return 0


def _cancel(args: argparse.Namespace) -> int:
    from lucid_core.domain import TERMINAL_STATES
    from lucid_core.runtime.queries import status
    from lucid_core.runtime.submission import cancel

    store = _store(args)
    already = status(store, args.job)["cancel_requested"]
    state = cancel(store, args.job)
    if state in {s.value for s in TERMINAL_STATES}:
        outcome, text = "ended", f"{args.job} already ended ({state}): nothing to cancel"
    elif already:
        outcome, text = "already_requested", f"{args.job}: cancel was already requested (state {state}); " \
                                             "the next round stops it"
    else:
        outcome, text = "requested", f"{args.job}: cancel requested (state {state}); the next round stops it"
    _print(args, {"job_id": args.job, "state": state, "outcome": outcome}, text)
    return 0


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "~"


def _queue(args: argparse.Namespace) -> int:
    from lucid_core.runtime.queries import queue

    rows = queue(_store(args))
    lines = [f"{'JOB':<10} {'NAME':<24} {'USER':<10} {'VC':<10} {'STATE':<10} {'POS':>4} {'GPUS':>4} "
             f"{'PRED':>9} {'PRIO(GPU-h)':>11}  REASON"]
    for r in rows:
        pred = "-" if r["predicted_duration_s"] is None else _duration(r["predicted_duration_s"])
        prio = "-" if r["priority_gpu_s"] is None else f"{r['priority_gpu_s'] / 3600:.3f}"
        lines.append(f"{r['job_id']:<10} {_cut(r['name'] or '-', 24):<24} {_cut(r['user'], 10):<10} "
                     f"{_cut(r['vc'], 10):<10} {r['state']:<10} {r['position'] or '-':>4} {r['gpus']:>4} {pred:>9} "
                     f"{prio:>11}  {r['pending_reason'] or ''}")
    _print(args, rows, "\n".join(lines) if rows else "no running or waiting job (finished ones: lucid history)")
    return 0


def _duration(seconds: float | None) -> str:
    """A duration rounded for a person: 42 s, 12.5 min, 10.8 h."""
    from lucid_core.runtime.explain import duration_words

    return "-" if seconds is None else duration_words(seconds)


def _history(args: argparse.Namespace) -> int:
    from lucid_core.runtime.queries import HistoryQuery, history

    now = time.time()
    states = tuple(STATE_ALIASES.get(s.strip().upper(), s.strip().upper())
                   for s in (args.state or "").split(",") if s.strip())
    query = HistoryQuery(user=args.user, vc=args.vc, states=states,
                         since=parse_since(args.since, now) if args.since else None,
                         until=parse_since(args.until, now) if args.until else None,
                         limit=args.limit, offset=args.offset)
    fields = history_columns(args.format)
    store = _store(args)
    with store.session() as session:
        page = history(session, query)
    if args.as_json:
        _print(args, {"total": page.total, "offset": query.offset, "jobs": page.rows}, "")
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


def _status(args: argparse.Namespace) -> int:
    from lucid_core.runtime.queries import status

    data = status(_store(args), args.job)
    exit_code = "" if data["exit_code"] is None else f"  exit code {data['exit_code']}"
    text = "\n".join([
        f"{data['job_id']} {data['state']}  {data['name'] or '(no name)'}  {data['gpus']} GPU(s)  user {data['user']}  "
        f"VC {data['vc']}",
        f"submitted {local_time(data['submit_time'])}  started {local_time(data['start_time'])}  "
        f"ended {local_time(data['end_time'])}{exit_code}",
        *(f"  run {r['run_id']} on {r['host']} GPUs {r['gpus']}: {r['state']} {r['outcome'] or ''}"
          for r in data["runs"]),
        *([f"waiting: {data['pending_reason']}"] if data["pending_reason"] else []),
        *([f"end: {data['end_reason']}"] if data["end_reason"] else []),
    ])
    _print(args, data, text)
    return 0


def _executor(args: argparse.Namespace, deadline_s: float | None = None) -> Any:
    """The SSH (and local) executor; `deadline_s` bounds each host call (the round's host_call_deadline_s)."""
    from lucid_core.runtime.ssh_executor import ssh_executor

    if deadline_s is None:
        return ssh_executor(getattr(args, "known_hosts", None))
    return ssh_executor(getattr(args, "known_hosts", None), timeout_s=deadline_s,
                        connect_timeout_s=min(10.0, deadline_s))


def _tail_lines(text: str, lines: int | None) -> str:
    """The last `lines` lines of `text` (all of it when None)."""
    if lines is None or not text:
        return text
    kept = text.splitlines(keepends=True)[-lines:] if lines > 0 else []
    return "".join(kept)


def _new_output(seen: str, now: str) -> str:
    """What `now` (a tail of a growing log) adds after `seen` (an earlier tail of the same log)."""
    if now.startswith(seen):
        return now[len(seen):]
    for cut in range(1, len(seen)):  # the tail window moved: find where the old tail's end is in the new one
        if now.startswith(seen[cut:]):
            return now[len(seen) - cut:]
    return now


def _logs(args: argparse.Namespace) -> int:
    from lucid_core.domain import TERMINAL_STATES
    from lucid_core.runtime.queries import logs, status

    store = _store(args)
    stream = "stderr" if args.stderr else "stdout"
    cap = 1 << 20 if args.follow else 65536
    text = logs(store, _executor(args), args.job, stream, max_bytes=cap)
    sys.stdout.write(_tail_lines(text, args.lines))
    sys.stdout.flush()
    terminal = {s.value for s in TERMINAL_STATES}
    while args.follow:
        ended = status(store, args.job)["state"] in terminal
        time.sleep(0 if ended else args.interval)
        now = logs(store, _executor(args), args.job, stream, max_bytes=cap)
        sys.stdout.write(_new_output(text, now))
        sys.stdout.flush()
        text = now
        if ended:
            break
    if not text and stream == "stdout":
        data = status(store, args.job)
        other = logs(store, _executor(args), args.job, "stderr", max_bytes=4096)
        if other:
            print(f"(stdout of {args.job} is empty; it wrote {len(other)} bytes to stderr: "
                  f"lucid logs {args.job} --stderr)", file=sys.stderr)
        elif not data["runs"]:
            print(f"({args.job} has not started yet: {data['pending_reason'] or data['state']})", file=sys.stderr)
    return 0


def _config(args: argparse.Namespace) -> Any:
    return load_live_config(args.config, args.set)


def _explain(args: argparse.Namespace) -> int:
    from lucid_core.runtime.explain import explain, explain_terms, shared_speed_line
    from lucid_core.runtime.submission import UnknownJob

    try:
        data = explain(_store(args), args.job, _config(args), time.time())
    except KeyError:
        raise UnknownJob(args.job) from None
    prio = data["priority"]
    lines = [f"{data['job_id']} {data['state']}: {data['gpus']} GPU(s), user {data['user']}, VC {data['vc']}"]
    if prio["predicted_duration_s"] is not None:
        lines.append(f"priority {prio['value_gpu_s'] / 3600:.3f} GPU-h = {prio['gpus']} GPU(s) x predicted "
                     f"{_duration(prio['predicted_duration_s'])}")
    if data.get("ordered_by"):
        lines.append(f"ordered by {data['ordered_by']['why']}")
    recorded = prio.get("recorded")
    if recorded:
        lines.append(f"  used when placed ({local_time(recorded['time'])}): {recorded['note']}")
    now_says = explain_terms(prio.get("duration") or {})
    if now_says and not (recorded and len(now_says) == 1 and now_says[0] in recorded["note"]):
        lines.append("  the duration model now says:" if recorded else "  the duration model says:")
        lines += [f"    {line}" for line in now_says]
    packing = data["packing"]
    if packing["class"]:
        lines.append(f"packing class {packing['class']}: " + " / ".join(packing["path"]))
    if data["partner"]:
        lines.append(f"shares with {data['partner']['job_id']}: {data['partner']['why']}")
    if data["shared"]:
        lines.append(shared_speed_line(data["shared"]))
    sharing = data["sharing"]
    if not sharing["allowed"]:
        lines.append(f"may not share a GPU: {sharing['why']}")
        if sharing.get("measured"):
            lines.append(f"  {sharing['measured']}")
    if data["pending"]:
        lines.append(f"waiting (position {data['pending']['position']}): {data['pending']['reason']}")
    for d in data["decisions"]:
        lines.append(f"  {local_time(d['time'])} {d['kind']} [{d['status']}]: {d['reason']}")
    _print(args, data, "\n".join(lines))
    return 0


def _eta(args: argparse.Namespace) -> int:
    from lucid_core.runtime.eta import estimate
    from lucid_core.runtime.submission import UnknownJob

    try:
        eta = estimate(_store(args), args.job, _config(args), time.time())
    except KeyError:
        raise UnknownJob(args.job) from None
    _print(args, asdict(eta),
           f"{eta.job_id} {eta.state}: start {local_time(eta.start)}, end {local_time(eta.end)} ({eta.note})")
    return 0


def _hosts(args: argparse.Namespace) -> int:
    from lucid_core.runtime.inventory import HostSpec, InventoryError, add_host, drain_host, list_hosts, remove_host
    from lucid_core.runtime.lease import Fenced, LeaseHeld

    store = _store(args)
    try:
        if args.hosts_cmd == "add":
            spec = HostSpec(args.name, address=args.address, port=args.port, user=args.user or "",
                            key_path=args.key, vc=args.vc, pool=args.pool, executor=args.executor,
                            telemetry=args.telemetry, workdir=args.workdir, python=args.python, gpus=args.gpus,
                            gpu_memory_mb=args.gpu_memory_mb, run_as=args.run_as)
            gpus = add_host(store, spec, None if args.gpus else _executor(args))
            _print(args, {"name": args.name, "gpus": len(gpus)}, f"added {args.name} with {len(gpus)} GPU(s)")
        elif args.hosts_cmd == "list":
            rows = list_hosts(store)
            text = "\n".join(f"{h['name']:<12} {h['address']:<22} {h['pool']:<9} VC {h['vc']:<10} "
                             f"{h['busy_gpus']}/{h['gpus']} busy"
                             f"{' jobs run as their user' if h['run_as'] == 'submitter' else ''}"
                             f"{' draining' if h['draining'] else ''}{'' if h['reachable'] else ' UNREACHABLE'}"
                             for h in rows)
            _print(args, rows, text or "no hosts")
        elif args.hosts_cmd == "drain":
            drain_host(store, args.name, not args.undo, remove=args.remove, wait_s=args.wait)
            state = ("accepting work" if args.undo else
                     "draining; a round removes it once its runs have ended" if args.remove else "draining")
            _print(args, {"name": args.name, "draining": not args.undo, "remove_when_empty": args.remove},
                   f"{args.name}: {state}")
        elif args.hosts_cmd == "remove":
            remove_host(store, args.name, wait_s=args.wait)
            _print(args, {"name": args.name, "removed": True}, f"removed {args.name}")
        elif args.hosts_cmd == "check":
            from lucid_core.runtime.host_check import check_host

            names = args.names or [h["name"] for h in list_hosts(store)]
            executor = _executor(args)
            try:
                reports = [check_host(store, executor, n, as_user=args.as_user) for n in names]
            finally:
                executor.close()
            _print(args, [{"host": r.host, "ok": r.ok, "checks": [vars(i) for i in r.items]} for r in reports],
                   "\n".join(r.describe() for r in reports) or "no hosts")
            return 0 if all(r.ok for r in reports) else 1
    except InventoryError as exc:
        print(f"lucid hosts {args.hosts_cmd}: error: {exc}", file=sys.stderr)
        return 2
    except LeaseHeld as exc:  # not bad input: a round holds the lease for longer than --wait
        print(f"lucid hosts {args.hosts_cmd}: {exc}", file=sys.stderr)
        return 1
    except Fenced as exc:  # the change outlasted its hold on the lease and a round took it: nothing written
        print(f"lucid hosts {args.hosts_cmd}: not done, try again: {exc}", file=sys.stderr)
        return 1
    return 0


def _metrics(args: argparse.Namespace) -> int:
    from lucid_core.runtime.prometheus import render

    sys.stdout.write(render(_store(args)).decode())
    return 0


def _seconds(text: str) -> float:
    """A duration such as 30, 30s, 2m or 1h, in seconds."""
    units = {"s": 1.0, "m": 60.0, "h": 3600.0}
    try:
        value = float(text[:-1]) * units[text[-1]] if text and text[-1] in units else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 30s, 2m or 1h") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return value


def _round(args: argparse.Namespace) -> int:
    from lucid_core.runtime.round import RoundSettings, SchedulingRound

    config = _config(args)
    given = {"stop_grace_s": args.stop_grace, "lease_ttl_s": args.lease_ttl}
    settings = RoundSettings.from_config(config, **{k: v for k, v in given.items() if v is not None})
    store = _store(args)
    executor = _executor(args, settings.host_call_deadline_s)
    if args.every is None:
        return _one_round(args, SchedulingRound(store, executor, config, settings).run())
    done, code = 0, 0
    try:
        while args.rounds is None or done < args.rounds:
            began = time.monotonic()
            try:  # one executor for the loop: each host's SSH connection is kept from round to round
                code = _one_round(args, SchedulingRound(store, executor, config, settings, close_executor=False).run())
            except Exception as exc:  # a failed round is repaired by the next one: report it and go on
                print(f"round failed: {type(exc).__name__}: {exc}", file=sys.stderr)
                code = 1
            done += 1
            if args.rounds is None or done < args.rounds:
                time.sleep(max(0.0, args.every - (time.monotonic() - began)))
    finally:
        executor.close()
    return code


def _one_round(args: argparse.Namespace, report: Any) -> int:
    if not report.acquired:
        print("another round holds the lease; nothing done", file=sys.stderr)
        return 3
    lines = [f"round {report.round_id}: {len(report.decisions)} decision(s) in {report.decide_ms:.2f} ms "
             f"(round {report.total_ms:.0f} ms)"]
    lines += [f"  {kind} {job or ''}: {reason}" for kind, job, reason in report.decisions]
    lines += [f"  ended {job}: {state}" for job, state in report.ended.items()]
    lines += [f"  unreachable: {h}" for h in report.unreachable]
    lines += [f"  conflict: {c}" for c in report.conflicts]
    lines += [f"  removed drained host: {h}" for h in report.removed_hosts]
    lines += [f"  error: {e}" for e in report.errors]
    if report.fenced:
        lines.append(f"  FENCED: {report.fenced}")
    _print(args, asdict(report), "\n".join(lines))
    return 4 if report.fenced else 0


def add_parser(subparsers: Any) -> None:
    """Register the live-scheduler subcommands on the `lucid` parser's subparsers."""
    p = subparsers.add_parser("submit", help="submit a job: lucid submit --gpus 2 --vc VC -- COMMAND...")
    _common(p)
    p.add_argument("--gpus", type=int, required=True)
    p.add_argument("--name", default="")
    p.add_argument("--user", default=getpass.getuser())
    p.add_argument("--vc", required=True)
    p.add_argument("--amp", action="store_true", help="the job trains with mixed precision")
    p.add_argument("--long-cold-start", action="store_true", help="give it the longer profiling window")
    p.add_argument("--preemptible", action="store_true",
                   help="the job resumes from its own checkpoints, so Lucid may stop it for a much shorter job")
    p.add_argument("--env", action="append", metavar="NAME=VALUE")
    p.add_argument("--workload", default=None, help="catalog key for hosts with emulated telemetry")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    p.set_defaults(func=_submit)
    for name, func, doc in (("cancel", _cancel, "cancel a job"), ("status", _status, "a job's state and runs"),
                            ("explain", _explain, "why a job is where it is"),
                            ("eta", _eta, "what-if start and end time of a job")):
        p = subparsers.add_parser(name, help=doc)
        _common(p)
        p.add_argument("job")
        p.set_defaults(func=func)
    p = subparsers.add_parser("logs", help="a job's output (its latest run's stdout, or --stderr)")
    _common(p)
    p.add_argument("job")
    p.add_argument("--stderr", action="store_true", help="the error output instead of stdout")
    p.add_argument("-n", "--lines", type=int, default=None, metavar="N", help="only the last N lines")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new output until the job ends")
    p.add_argument("--interval", type=float, default=2.0, help="seconds between reads with --follow")
    p.add_argument("--known-hosts", default=None)
    p.set_defaults(func=_logs)
    p = subparsers.add_parser("queue", help="running and waiting jobs with priority and pending reason")
    _common(p)
    p.set_defaults(func=_queue)
    p = subparsers.add_parser("history", help="finished, failed and cancelled jobs (like sacct)")
    _common(p)
    p.add_argument("-u", "--user", default=None, help="only this user's jobs (default: every user)")
    p.add_argument("--vc", default=None, help="only this virtual cluster's jobs")
    p.add_argument("-s", "--state", default=None,
                   help="end states, comma-separated: COMPLETED (CD), FAILED (F), CANCELLED (CA)")
    p.add_argument("-S", "--since", default=None, help="ended at or after: 2026-12-01, 2026-12-01T10:00, or 6h, 3d")
    p.add_argument("-E", "--until", default=None, help="ended before (same forms as --since)")
    p.add_argument("-o", "--format", default=None,
                   help="fields, comma-separated (sacct names work): JobID,JobName,User,VC,GPUs,State,Submit,"
                        "Start,End,Queued,Elapsed,ExitCode,Reason,InProfiling")
    p.add_argument("--limit", type=int, default=50, help="jobs per page (default 50)")
    p.add_argument("--offset", type=int, default=0, help="skip this many (the next page)")
    p.set_defaults(func=_history)
    hosts = subparsers.add_parser("hosts", help="GPU hosts: add, list, drain, remove, check")
    hsub = hosts.add_subparsers(dest="hosts_cmd", required=True)
    add = hsub.add_parser("add")
    _common(add)
    add.add_argument("name")
    add.add_argument("--address", default="127.0.0.1")
    add.add_argument("--port", type=int, default=22)
    add.add_argument("--user", default="")
    add.add_argument("--key", default=None, help="private key file")
    add.add_argument("--vc", default="default")
    add.add_argument("--pool", choices=("main", "profiling"), default="main")
    add.add_argument("--executor", choices=("ssh", "local"), default="ssh")
    add.add_argument("--telemetry", choices=("nvml", "emulated"), default="nvml")
    add.add_argument("--workdir", default="~/.lucid-runs")
    add.add_argument("--python", default="python3")
    add.add_argument("--gpus", type=int, default=None, help="declare the GPU count (default: discover via nvidia-smi)")
    add.add_argument("--gpu-memory-mb", type=float, default=24576.0)
    add.add_argument("--run-as", choices=("account", "submitter"), default="account",
                     help="whom jobs run as on the host: the SSH account (default), or each job's submitting "
                          "user through 'sudo -n -u USER' (the host's sudoers must allow it)")
    add.add_argument("--known-hosts", default=None)
    for name in ("list", "drain", "remove"):
        sp = hsub.add_parser(name)
        _common(sp)
        if name != "list":
            sp.add_argument("name")
        if name == "drain":
            sp.add_argument("--undo", action="store_true", help="accept new work again")
            sp.add_argument("--remove", action="store_true",
                            help="remove the host once its runs have ended (a round does it)")
        if name != "list":
            sp.add_argument("--wait", type=float, default=60.0,
                            help="seconds to wait for a running scheduling round to finish (default 60)")
    check = hsub.add_parser("check", help="is each host ready to run jobs? (reach, workdir, disk, python, "
                                          "setsid, NVML, GPU count, sudo for submitter hosts)")
    _common(check)
    check.add_argument("names", nargs="*", help="hosts to check (default: all)")
    check.add_argument("--as-user", default=None, help="on submitter hosts: check that sudo reaches this user")
    check.add_argument("--known-hosts", default=None)
    hosts.set_defaults(func=_hosts)
    p = subparsers.add_parser("metrics", help="Prometheus metrics of the store (queue, GPUs, hosts, rounds)")
    _common(p)
    p.set_defaults(func=_metrics)
    p = subparsers.add_parser("round", help="run one scheduling round (reconcile, decide, execute)")
    _common(p)
    p.add_argument("--known-hosts", default=None)
    p.add_argument("--stop-grace", type=float, default=None,
                   help="seconds between TERM and KILL (default: runtime.stop_grace_s)")
    p.add_argument("--lease-ttl", type=float, default=None, help="default: runtime.lease_ttl_s")
    p.add_argument("--every", type=_seconds, default=None, metavar="INTERVAL",
                   help="keep running rounds this often (e.g. 30s, 1m), one connection to the store")
    p.add_argument("--rounds", type=int, default=None, help="with --every: stop after this many rounds")
    p.set_defaults(func=_round)
