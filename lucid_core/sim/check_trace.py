"""`lucid check-trace FILE`: read a trace in any format (Pollux workloads included) and report every skipped row.

Apart from `traces` so that the readers stay a leaf: this command reads both `traces` and `pollux_trace`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from lucid_core.sim.traces import TRACE_FORMATS, TraceFormatError, describe, read_trace


def add_parser(subparsers) -> argparse.ArgumentParser:
    """`lucid check-trace FILE`: read a trace and report kept jobs and every skipped row."""
    parser = subparsers.add_parser("check-trace", help="read a trace file and report bad rows")
    parser.add_argument("trace", type=Path, help="trace CSV file")
    parser.add_argument("--format", default="auto", choices=("auto", *TRACE_FORMATS, "pollux"),
                        help="trace format (pollux: elastic-job workloads, see sim.pollux_trace)")
    parser.add_argument("--profiles", help="pollux format: folder of application profiles")
    parser.add_argument("--start", default=None, help="keep jobs submitted at or after (ISO date/time)")
    parser.add_argument("--end", default=None, help="keep jobs submitted before (ISO date/time)")
    parser.add_argument("--examples", type=int, default=3, help="example rows shown per problem kind")
    parser.set_defaults(func=_check_trace_cli)
    return parser


def _check_trace_cli(args: argparse.Namespace) -> int:
    if args.format == "pollux":
        from lucid_core.sim.elastic_apps import AppFormatError
        from lucid_core.sim.pollux_trace import read_pollux_trace

        try:
            pollux = read_pollux_trace(args.trace, args.profiles)
        except (TraceFormatError, AppFormatError, OSError) as error:
            print(f"error: {error}")
            return 2
        print(f"{len(pollux.jobs)} jobs kept of {pollux.rows_read} rows; applications "
              f"{', '.join(sorted(pollux.applications))}\n{pollux.problem_summary()}")
        return 1 if pollux.problems else 0
    try:
        trace = read_trace(args.trace, args.format, args.start, args.end)
    except (TraceFormatError, OSError) as error:
        print(f"lucid check-trace: error: {error}", file=sys.stderr)
        return 2
    print(describe(trace, args.examples))
    return 1 if trace.problems else 0
