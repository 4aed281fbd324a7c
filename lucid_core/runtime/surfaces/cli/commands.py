"""`lucid` subcommands of the live scheduler: submit, cancel, queue, history, status, logs, explain, eta, hosts,
round.

Expected errors (an unknown job, a bad value, an unreachable host) are raised and said in one line by
`lucid_core.cli.main` (exit 2); a command returns 1 only for a check that ran and found a problem.

`add_parser(subparsers)` registers them on the main `lucid` parser; each sets `func(args) -> int`, one of the
commands of `jobs`, `fleet` and `rounds` (what they share: `context`).
"""

from __future__ import annotations

import argparse
import getpass
from typing import Any

from lucid_core.runtime.surfaces.cli.context import warns_when_rounds_stall
from lucid_core.runtime.surfaces.cli.fleet import cmd_hosts, cmd_metrics
from lucid_core.runtime.surfaces.cli.jobs import (
    cmd_cancel,
    cmd_eta,
    cmd_explain,
    cmd_history,
    cmd_queue,
    cmd_status,
    cmd_submit,
)
from lucid_core.runtime.surfaces.cli.logs import ENDED_RETRY_S, LINES_SEARCH_BYTES, cmd_logs, line_count
from lucid_core.runtime.surfaces.cli.rounds import cmd_round


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", dest="store_url", default=None,
                   help="store URL (default: LUCID_STORE_URL, else SQLite in LUCID_HOME)")
    p.add_argument("--config", "--lucid-config", dest="config", default=None,
                   help="config file, TOML or YAML (default: LUCID_CONFIG, else LUCID_HOME/lucid.toml if it exists)")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KNOB=VALUE", help="override a knob")
    p.add_argument("--json", dest="as_json", action="store_true", help="print JSON")


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


def _interval(text: str) -> float:
    """Seconds between reads: a finite number from 0.05 to 3600."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0.05 <= value <= 3600:  # NaN fails this too
        raise argparse.ArgumentTypeError(f"{text!r} must be from 0.05 to 3600 seconds")
    return value


def _duration(text: str) -> float:
    """An option's duration in seconds (units.parse_duration), refused in argparse's words."""
    from lucid_core.units import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _queue_filters(p: argparse.ArgumentParser, verb: str) -> None:
    """The filters `lucid queue` and `lucid cancel` take, as squeue and scancel do (`job_views.QueueQuery`)."""
    p.add_argument("-u", "--user", default=None, help=f"{verb} these users' jobs, comma-separated")
    p.add_argument("--me", action="store_true", help=f"{verb} your own jobs (as --user {getpass.getuser()})")
    p.add_argument("--vc", default=None, help=f"{verb} these virtual clusters' jobs, comma-separated")
    p.add_argument("-t", "--state", default=None,
                   help=f"{verb} jobs in these states, comma-separated: SUBMITTED, PROFILING, QUEUED, RUNNING, or "
                        "Slurm's PD (pending: submitted, profiling or queued) and R")


def add_parser(subparsers: Any) -> None:
    """Register the live-scheduler subcommands on the `lucid` parser's subparsers."""
    p = subparsers.add_parser("submit", help="submit a job: lucid submit --gpus 2 [--vc VC] -- COMMAND...")
    _common(p)
    p.add_argument("--gpus", type=int, required=True)
    p.add_argument("--name", default="")
    p.add_argument("--user", default=getpass.getuser())
    p.add_argument("--vc", default=None, help="virtual cluster (default: the only one, when the main hosts have one)")
    p.add_argument("--amp", action="store_true", help="the job trains with mixed precision")
    p.add_argument("--long-cold-start", action="store_true", help="give it the longer profiling window")
    p.add_argument("--preemptible", action="store_true",
                   help="the job resumes from its own checkpoints, so Lucid may stop it for a much shorter job")
    p.add_argument("--env", action="append", metavar="NAME=VALUE")
    p.add_argument("--workload", default=None, help="catalog key for hosts with emulated telemetry")
    p.add_argument("--time-limit", "-t", type=_duration, default=None, metavar="DURATION", dest="time_limit_s",
                   help="the longest it may run, all its runs together (90m, 12h, 2d, or Slurm's HH:MM:SS, "
                   "D-HH:MM:SS); past it the job is stopped and fails")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command, after --")
    p.set_defaults(func=cmd_submit)
    p = subparsers.add_parser("cancel", help="cancel jobs: lucid cancel JOB... or lucid cancel --me [--state PD]")
    _common(p)
    p.add_argument("jobs", nargs="*", metavar="JOB")
    _queue_filters(p, "cancel only")
    p.set_defaults(func=cmd_cancel)
    for name, func, doc in (("status", warns_when_rounds_stall(cmd_status, "status"), "a job's state and runs"),
                            ("explain", cmd_explain, "why a job is where it is"),
                            ("eta", cmd_eta, "what-if start and end time of a job")):
        p = subparsers.add_parser(name, help=doc)
        _common(p)
        p.add_argument("job")
        p.set_defaults(func=func)
    p = subparsers.add_parser("logs", help="a job's output (its latest run's stdout, or --stderr)")
    _common(p)
    p.add_argument("job")
    p.add_argument("--stderr", action="store_true", help="the error output instead of stdout")
    which = p.add_mutually_exclusive_group()
    which.add_argument("-n", "--lines", type=line_count, default=None, metavar="N",
                       help="the last N lines, as tail -n (looked for in the last "
                       f"{LINES_SEARCH_BYTES >> 20} MiB of the log); +K: from line K on (as tail -n +K)")
    which.add_argument("--all", action="store_true",
                       help="the whole log from its start, read a chunk at a time (as cat, or tail -n +1)")
    p.add_argument("-f", "--follow", action="store_true",
                   help="then keep printing new output until the job ends, every byte once (without -n or --all: "
                   "from the first whole line of its last MiB); a host or store that stops answering meanwhile is "
                   f"waited for, and an ended job's rest tried for {ENDED_RETRY_S:g} s (then exit 1)")
    p.add_argument("--interval", type=_interval, default=2.0, help="seconds between reads with --follow")
    p.add_argument("--known-hosts", default=None)
    p.set_defaults(func=cmd_logs)
    p = subparsers.add_parser("queue", help="running and waiting jobs with priority and pending reason")
    _common(p)
    _queue_filters(p, "only")
    p.set_defaults(func=warns_when_rounds_stall(cmd_queue, "queue"))
    p = subparsers.add_parser("history", help="finished, failed and cancelled jobs (like sacct)")
    _common(p)
    p.add_argument("-u", "--user", default=None, help="only these users' jobs, comma-separated (default: every user)")
    p.add_argument("--me", action="store_true", help=f"only your own jobs (as --user {getpass.getuser()})")
    p.add_argument("--vc", default=None, help="only these virtual clusters' jobs, comma-separated")
    p.add_argument("-s", "--state", default=None,
                   help="end states, comma-separated: COMPLETED (CD), FAILED (F), CANCELLED (CA)")
    p.add_argument("-S", "--since", default=None, help="ended at or after: 2026-12-01, 2026-12-01T10:00, or 6h, 3d")
    p.add_argument("-E", "--until", default=None, help="ended before (same forms as --since)")
    p.add_argument("-o", "--format", default=None,
                   help="fields, comma-separated (sacct names work): JobID,JobName,User,VC,GPUs,State,Submit,"
                        "Start,End,Queued,Elapsed,ExitCode,Reason,InProfiling,Timelimit,Ran,NodeList. Start is its "
                        "first on the main cluster; Queued until then (profiling included); Elapsed from then to its "
                        "end; Ran: its runs' time in all, profiling too (what --time-limit counts); NodeList: the "
                        "hosts it ran on")
    p.add_argument("--limit", type=int, default=50, help="jobs per page (default 50)")
    p.add_argument("--offset", type=int, default=0, help="skip this many (the next page)")
    p.set_defaults(func=cmd_history)
    hosts = subparsers.add_parser("hosts", help="GPU hosts: add, list, drain, remove, check")
    hsub = hosts.add_subparsers(dest="hosts_cmd", required=True, metavar="{add,list,drain,remove,check}")
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
    add.add_argument("--workdir", default=None,
                     help="the host's directory for runs (default: ~/.lucid-runs on an SSH host; LUCID_HOME/hosts/NAME "
                          "with --executor local, so that local hosts never share one)")
    add.add_argument("--python", default="python3")
    add.add_argument("--gpus", type=int, default=None, help="declare the GPU count (default: discover via nvidia-smi)")
    add.add_argument("--gpu-memory-mb", type=float, default=24576.0)
    add.add_argument("--run-as", choices=("account", "submitter"), default="account",
                     help="whom jobs run as on the host: the SSH account (default), or each job's submitting "
                          "user through 'sudo -n -u USER' (the host's sudoers must allow it)")
    add.add_argument("--sharing", choices=("none", "time-slice", "mps"), default="time-slice",
                     help="how two jobs share one of its GPUs: time-slice (the GPU's default), mps (the host runs "
                          "an MPS control daemon per shared GPU; Lucid starts it) or none; pairs form only where "
                          "a packing model for this GPU model and mechanism was promoted")
    add.add_argument("--gpu-model", default=None,
                     help="GPU model name as nvidia-smi prints it, e.g. 'NVIDIA H200' (default: discovered; "
                          "needed with --gpus, else the host shares nothing)")
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
    hosts.set_defaults(func=cmd_hosts)
    p = subparsers.add_parser("metrics", help="Prometheus metrics of the store (queue, GPUs, hosts, rounds)")
    _common(p)
    p.set_defaults(func=cmd_metrics)
    p = subparsers.add_parser("round", help="run one scheduling round (reconcile, decide, execute)")
    _common(p)
    p.add_argument("--known-hosts", default=None)
    p.add_argument("--stop-grace", type=float, default=None,
                   help="seconds between TERM and KILL (default: runtime.stop_grace_s)")
    p.add_argument("--lease-ttl", type=float, default=None, help="default: runtime.lease_ttl_s")
    p.add_argument("--every", type=_seconds, default=None, metavar="INTERVAL",
                   help="keep running rounds this often (e.g. 30s, 1m), one connection to the store")
    p.add_argument("--rounds", type=int, default=None, help="with --every: stop after this many rounds")
    p.set_defaults(func=cmd_round)
