"""`lucid round`: one scheduling round, or (with --every) a loop of them on one store and executor."""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from typing import Any

from lucid_core.runtime.surfaces.cli.context import config_of, emit, executor_of, store_of


def cmd_round(args: argparse.Namespace) -> int:
    from lucid_core.runtime.round.scheduling_round import RoundSettings, SchedulingRound

    config = config_of(args)
    given = {"stop_grace_s": args.stop_grace, "lease_ttl_s": args.lease_ttl}
    settings = RoundSettings.from_config(config, **{k: v for k, v in given.items() if v is not None})
    store = store_of(args)
    executor = executor_of(args, settings.host_call_deadline_s)
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
    lines += [f"  {kind}{' ' + job if job else ''}: {reason}" for kind, job, reason in report.decisions]
    lines += [f"  ended {job}: {state}" for job, state in report.ended.items()]
    lines += [f"  unreachable: {h}" for h in report.unreachable]
    lines += [f"  conflict: {c}" for c in report.conflicts]
    lines += [f"  removed drained host: {h}" for h in report.removed_hosts]
    if report.pruned:
        lines.append(f"  removed the files of {len(report.pruned)} run(s) over for runtime.keep_ended_runs_days")
    lines += [f"  error: {e}" for e in report.errors]
    if report.fenced:
        lines.append(f"  FENCED: {report.fenced}")
    emit(args, asdict(report), "\n".join(lines))
    return 4 if report.fenced else 0
