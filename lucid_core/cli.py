"""`lucid`: the command line. Each area registers its own subcommands."""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from lucid_core.config import ConfigError, check_overrides, load_config, parse_overrides

#: What `lucid simulate --format` reads: detected, the trace formats of `sim.traces`, and Pollux workloads.
SIMULATE_FORMATS = ("auto", "philly", "helios", "generic", "pollux")


def _repo_include() -> Path:
    return Path(__file__).resolve().parents[1] / "include"


def add_simulate_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("simulate", help="replay a trace under Lucid and the baselines, side by side")
    p.add_argument("--trace", default=str(_repo_include() / "sample" / "trace.csv"),
                   help="trace file (default: the embedded synthetic sample)")
    p.add_argument("--format", default="auto", choices=SIMULATE_FORMATS,
                   help="auto, philly, helios, generic or pollux (elastic-job workloads over measured applications)")
    p.add_argument("--policy", default="fifo,sjf,qssf,tiresias,lucid",
                   help="comma-separated: fifo,sjf,qssf,qssf-backfill,horus,tiresias,lucid and lucid ablations "
                        "(lucid-nosharing, lucid-noprofiler, lucid-noestimator, lucid-fixedtprof); "
                        "pollux workloads: pollux,tiresias,lucid,fifo,sjf")
    p.add_argument("--start", help="first submit day/time simulated (earlier jobs train the predictors)")
    p.add_argument("--end", help="end of the submit window (exclusive)")
    p.add_argument("--nodes", default="3", help="cluster size in nodes; several as 108,72,54")
    p.add_argument("--gpus-per-node", type=int, help="GPUs per node (default: the config's cluster.gpus_per_node)")
    p.add_argument("--history", help="pollux format: an earlier workload whose jobs train Lucid's duration "
                                     "model (a pollux workload has no history of its own)")
    p.add_argument("--profiles", help="pollux format: folder of application profiles "
                                      "(default: the nearest traces/ folder above the workload)")
    p.add_argument("--vc-config", help="virtual clusters as CSV rows 'name,nodes' (e.g. Venus vc_config.csv); "
                                        "each VC's jobs run on its own nodes and --nodes is ignored")
    p.add_argument("--catalog", default=str(_repo_include() / "sample"),
                   help="workload catalog dir (single_data.csv + colocate_info.csv); default: synthetic sample")
    p.add_argument("--config", help="TOML or YAML config file")
    p.add_argument("--set", action="append", default=[], metavar="SECTION.KNOB=VALUE", help="override a knob")
    p.add_argument("--out", default="out/simulate", help="where tables, per-job CSVs and plots go")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--preemptible-share", type=_share, metavar="P",
                   help="mark a seeded share P (0..1) of the jobs preemptible, the rest not, whatever the trace "
                        "says (default: as the trace's preemptible column says; a trace without one has none, "
                        "so Lucid stops no job). Tiresias preempts every job regardless")
    p.add_argument("--round-interval", type=_round_interval, default=0.0, metavar="S",
                   help="let every policy decide only at rounds S seconds apart, as a live deployment's scheduling "
                        "rounds do (60 for the scheduling DAG's default of one a minute); default 0: at every "
                        "event, as the papers' simulators")
    p.add_argument("--check-invariants", action="store_true", help="verify GPU invariants after every event")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_simulate, format_flag_defaults={dest: p.get_default(dest) for dest in FORMAT_FLAGS})
    return p


#: `lucid simulate` flags that apply to one kind of trace only: dest -> (flag, True: pollux workloads only,
#: False: every format but pollux). Given for the other kind they would be silently ignored, so they are refused.
FORMAT_FLAGS: dict[str, tuple[str, bool]] = {
    "start": ("--start", False), "end": ("--end", False), "preemptible_share": ("--preemptible-share", False),
    "vc_config": ("--vc-config", False), "seed": ("--seed", False), "check_invariants": ("--check-invariants", False),
    "round_interval": ("--round-interval", False),
    "history": ("--history", True), "profiles": ("--profiles", True),
}


def check_format_flags(args: argparse.Namespace) -> None:
    """ConfigError naming the first flag the user gave (it differs from its default) that the chosen
    --format does not use: `--start` with pollux workloads, `--history` with a philly trace."""
    pollux = args.format == "pollux"
    defaults = getattr(args, "format_flag_defaults", {})
    for dest, (flag, pollux_only) in FORMAT_FLAGS.items():
        if pollux_only == pollux or dest not in defaults or getattr(args, dest, None) == defaults[dest]:
            continue
        if pollux_only:
            raise ConfigError(f"{flag} applies to --format pollux only, not to --format {args.format}; leave it out")
        raise ConfigError(f"{flag} does not apply to --format pollux (its workloads ignore it); leave it out")


def prepare_output(out: Path, node_counts: Sequence[int]) -> None:
    """Create --out and its per-size folders up front, so an unwritable one fails before any simulating
    (ConfigError naming --out and the folder)."""
    for folder in (out, *(out / f"nodes{n}" for n in node_counts)):
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except FileExistsError:
            raise ConfigError(f"--out: {folder} is a file, not a folder") from None
        except OSError as exc:
            raise ConfigError(f"--out: cannot create folder {folder}: {exc.strerror or exc}") from None
        if not os.access(folder, os.W_OK | os.X_OK):
            raise ConfigError(f"--out: folder {folder} is not writable")


def _share(text: str) -> float:
    """A share in [0, 1] for argparse."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number between 0 and 1") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is not between 0 and 1")
    return value


def _round_interval(text: str) -> float:
    """A round interval for argparse: 0 (at every event) or a finite number of seconds >= MIN_INTERVAL_S."""
    from lucid_core.sim.rounds import MIN_INTERVAL_S

    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (value == 0 or MIN_INTERVAL_S <= value < float("inf")):
        raise argparse.ArgumentTypeError(f"{text} is neither 0 nor a finite number of seconds >= {MIN_INTERVAL_S:g}")
    return value


def _simulate(args: argparse.Namespace) -> int:
    policies = _policies(args.policy, args.format)  # before any file is read: a typo costs no wait
    check_format_flags(args)
    from lucid_core.sim.catalog import WorkloadCatalog
    from lucid_core.sim.experiment import read_vc_config
    from lucid_core.sim.report import PlotWorker

    config = load_config(args.config)
    pairs = parse_overrides(args.set)
    if pairs:
        config = config.with_overrides(pairs)
    if args.gpus_per_node is not None:
        config = config.with_overrides({"cluster.gpus_per_node": args.gpus_per_node})
    try:
        node_counts = [int(n) for n in str(args.nodes).split(",")]
    except ValueError:
        raise ConfigError(f"--nodes takes integers like 108,72,54, got {args.nodes!r}") from None
    if any(n < 1 for n in node_counts):
        raise ConfigError(f"--nodes must be positive, got {args.nodes!r}")
    vc_nodes = read_vc_config(args.vc_config) if args.vc_config else None
    if vc_nodes:
        node_counts = [sum(vc_nodes.values())]
    catalog = WorkloadCatalog.from_artifact(args.catalog)
    out = Path(args.out)
    prepare_output(out, node_counts)  # before the trace is read: an unwritable --out costs no wait
    if args.format == "pollux":
        from lucid_core.sim.pollux_experiment import simulate_pollux_cli

        return simulate_pollux_cli(args, config, pairs, catalog, node_counts, policies, out)
    with PlotWorker() as plots:  # started first: it imports matplotlib while the trace is read and simulated
        for nodes in node_counts:
            _simulate_size(args, nodes, config, catalog, vc_nodes, policies, out / f"nodes{nodes}", plots)
    return 0


def _policies(text: str, trace_format: str) -> list[str]:
    """The --policy names, each known to the simulator for this trace format (ConfigError naming the others)."""
    if trace_format == "pollux":
        from lucid_core.sim.pollux_experiment import POLLUX_POLICIES as known
    else:
        from lucid_core.sim.experiment import ABLATIONS, POLICIES

        known = (*POLICIES, "qssf-backfill", *ABLATIONS)
    policies = [p.strip() for p in text.split(",") if p.strip()]
    if not policies:
        raise ConfigError(f"--policy names no policy; choose from {', '.join(known)}")
    for name in policies:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f" (did you mean {close[0]}?)" if close else ""
            kind = " for pollux workloads" if trace_format == "pollux" else ""
            raise ConfigError(f"--policy: unknown policy {name!r}{hint}; choose{kind} from {', '.join(known)}")
    return policies


def _simulate_size(args: argparse.Namespace, nodes: int, config, catalog, vc_nodes: dict[str, int] | None,
                   policies: list[str], target: Path, plots) -> None:
    """One cluster size of `lucid simulate`: every policy, the table, the files and the plots."""
    from tqdm import tqdm

    from lucid_core.sim.experiment import load_experiment, run_policy
    from lucid_core.sim.report import side_by_side, write_results

    exp, problems = load_experiment(args.trace, args.format, args.start, args.end, nodes=nodes, catalog=catalog,
                                    config=config, seed=args.seed, vc_nodes=vc_nodes,
                                    preemptible_share=args.preemptible_share)
    exp = replace(exp, round_interval_s=args.round_interval)
    cadence = (f"; policies decide at rounds {args.round_interval:g} s apart" if args.round_interval > 0
               else "; policies decide at every event")
    print(f"{problems}\nsimulating {len(exp.records)} jobs ({len(exp.history)} earlier jobs as history) "
          f"on {nodes} nodes x {config.cluster.gpus_per_node} GPUs{cadence}")
    metrics, outcomes, timelines = {}, {}, {}
    for name in policies:
        # a bar only on a terminal: redirected, its redraws filled the file with carriage-return lines
        bar = None if args.no_progress or not sys.stderr.isatty() else tqdm(
            total=len(exp.records), desc=f"{name:>9} @{nodes}", unit="job", leave=False, file=sys.stderr)

        def progress(done: int, total: int, bar=bar) -> None:
            if bar is not None:
                bar.update(done - bar.n)

        result, m = run_policy(name, exp, check_invariants=args.check_invariants, progress=progress)
        if bar is not None:
            bar.close()
        metrics[name], outcomes[name] = m, result.outcomes
        timelines[name] = (result.busy_timeline, result.total_gpus)
    print(side_by_side(metrics))
    drawn = plots.draw(outcomes, timelines, target)  # drawn while the files are written
    write_results(target, outcomes, metrics, {"trace": args.trace, "start": args.start, "end": args.end,
                                              "nodes": nodes, "catalog": args.catalog, "seed": args.seed,
                                              "round_interval_s": args.round_interval,
                                              "config": config.to_dict()})
    drawn.result()
    print(f"results, per-job CSVs and plots in {target}/")


class UsageError(Exception):
    """A command line argparse refused; carries the parser that refused it (a subcommand's own)."""

    def __init__(self, parser: argparse.ArgumentParser, message: str) -> None:
        super().__init__(message)
        self.parser = parser


class LucidParser(argparse.ArgumentParser):
    """argparse whose errors reach `main`, which says them in one line (subparsers inherit the class)."""

    def error(self, message: str):  # type: ignore[override]
        raise UsageError(self, message)


def unknown_options(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """The `--options` of `argv` (before a bare `--`) that `parser` does not know."""
    known = set(parser._option_string_actions)
    unknown = []
    for token in argv:
        if token == "--":
            break
        name = token.split("=", 1)[0]
        if name.startswith("-") and len(name) > 1 and not _is_number(name) and name not in known:
            unknown.append(name)
    return unknown


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _deepest_subcommand(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.ArgumentParser:
    for token in argv:
        if token == "--":
            break
        choices = next((a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if choices and token in choices:
            parser = choices[token]
    return parser


def usage_line(error: UsageError, argv: Sequence[str]) -> str:
    """One line naming what is wrong: an unknown option (with the closest known one) before anything else."""
    parser, message = error.parser, str(error)
    if "unrecognized" in message:  # raised by the top parser: name the subcommand whose options they are not
        parser = _deepest_subcommand(parser, argv)
    unknown = unknown_options(parser, argv)  # named first: what follows an unknown flag is often misread
    if unknown:
        hints = []
        for name in unknown:
            if name[1:2].isdigit():  # `--since -3d`: a value that begins with a minus reads as an option
                hints.append(f"{name} (a value with a minus: counts and durations are 0 or more, as in {name[1:]})")
                continue
            close = difflib.get_close_matches(name, [o for o in parser._option_string_actions if o.startswith("--")],
                                              n=1, cutoff=0.5)
            hints.append(f"{name}" + (f" (did you mean {close[0]}?)" if close else ""))
        message = f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(hints)}"
    return f"{parser.prog}: error: {message}; see {parser.prog} --help"


#: Every subcommand, in the order `lucid --help` lists them: the module whose `add_parser` registers it and
#: its one-line help. `lucid --help` is written from this table and a command's own parser is built from its
#: module alone, so neither imports the areas it does not use (the models' pandas, the simulator's numpy).
#: tests/test_cli_ecosystem.py checks the table against what the modules register.
COMMANDS: dict[str, tuple[str, str]] = {
    "simulate": (__name__, "replay a trace under Lucid and the baselines, side by side"),
    "check-trace": ("lucid_core.sim.check_trace", "read a trace file and report bad rows"),
    "make-sample": ("lucid_core.sim.sample", "write the synthetic sample trace and workload catalog"),
    "models": ("lucid_core.models.cli", "train, evaluate and version the interpretable models"),
    **{name: ("lucid_core.runtime.surfaces.cli.commands", text) for name, text in (
        ("submit", "submit a job: lucid submit --gpus 2 [--vc VC] -- COMMAND..."),
        ("cancel", "cancel jobs: lucid cancel JOB... or lucid cancel --me [--state PD]"),
        ("status", "a job's state and runs"),
        ("explain", "why a job is where it is"),
        ("eta", "what-if start and end time of a job"),
        ("logs", "a job's output (its latest run's stdout, or --stderr)"),
        ("queue", "running and waiting jobs with priority and pending reason"),
        ("history", "finished, failed and cancelled jobs (like sacct)"),
        ("hosts", "GPU hosts: add, list, drain, remove, check"),
        ("metrics", "Prometheus metrics of the store (queue, GPUs, hosts, rounds)"),
        ("round", "run one scheduling round (reconcile, decide, execute)"))},
    "calibrate": ("lucid_core.calibration.cli", "measure exclusive and co-located speeds on a GPU; write a catalog"),
    "tune": ("lucid_core.tuner", "simulate a grid of scheduler settings on a trace and rank them"),
}


def _register(sub: argparse._SubParsersAction, module: str) -> None:
    """Register the subcommands of `module` (skipped when it is an optional area not installed here)."""
    if module == __name__:
        add_simulate_parser(sub)
        return
    try:
        mod = __import__(module, fromlist=["add_parser"])
    except ModuleNotFoundError as exc:  # an optional area not installed in this checkout
        if exc.name and module.startswith(exc.name):
            return
        raise
    mod.add_parser(sub)


def build_parser() -> argparse.ArgumentParser:
    """The `lucid` parser with every subcommand."""
    parser = LucidParser(prog="lucid", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for module in dict.fromkeys(module for module, _ in COMMANDS.values()):
        _register(sub, module)
    return parser


def parser_for(argv: Sequence[str]) -> argparse.ArgumentParser:
    """The parser `main` reads `argv` with: only the area registering its subcommand, or, with none named
    (`lucid --help`, a typo), help-only stand-ins listing every subcommand from `COMMANDS`."""
    parser = LucidParser(prog="lucid", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    if argv and argv[0] in COMMANDS:  # the top parser has no options but --help: a command comes first
        _register(sub, COMMANDS[argv[0]][0])
    else:
        for name, (_, text) in COMMANDS.items():
            sub.add_parser(name, help=text)
    return parser


def expected_errors() -> tuple[type[BaseException], ...]:
    """Errors a user's input or the fleet can cause: said in one line with exit 2, never as a traceback."""
    import sqlite3

    from sqlalchemy.exc import ArgumentError, OperationalError

    from lucid_core.runtime.hosts.executor import HostCommandFailed, HostUnreachable

    # ImportError: a store URL naming a database driver that is not installed; the drivers' OperationalError: a
    # store read without SQLAlchemy (`plain_read`) that cannot be reached or is locked (a bug in its SQL, a
    # ProgrammingError, still shows as one)
    drivers: tuple[type[BaseException], ...] = (sqlite3.OperationalError,)
    if "psycopg2" in sys.modules:
        drivers += (sys.modules["psycopg2"].OperationalError,)
    return (ConfigError, ValueError, LookupError, OSError, HostUnreachable, HostCommandFailed, OperationalError,
            ArgumentError, ImportError, *drivers)


def error_line(exc: BaseException) -> str:
    """The first line of an error's message (a KeyError's without its quotes)."""
    text = str(exc) if type(exc) is not KeyError else str(exc.args[0] if exc.args else exc)
    if isinstance(exc, ImportError) and exc.name:
        text = f"{text} (a store URL or feature needs the Python package providing {exc.name!r})"
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[0].strip() if lines else type(exc).__name__


#: Commands whose bare form (no subcommand, options only) means one of their subcommands, as `lucid queue` lists.
DEFAULT_SUBCOMMANDS = {"hosts": "list"}


def with_default_subcommand(argv: list[str]) -> list[str]:
    """`argv` with the default subcommand put in where a command that has one is given only options."""
    if argv[:1] and argv[0] in DEFAULT_SUBCOMMANDS and (len(argv) == 1 or (
            argv[1].startswith("-") and argv[1] not in ("-h", "--help"))):
        return [argv[0], DEFAULT_SUBCOMMANDS[argv[0]], *argv[1:]]
    return argv


def main(argv: list[str] | None = None) -> int:
    argv = with_default_subcommand(list(sys.argv[1:] if argv is None else argv))
    parser = parser_for(argv)
    try:
        args = parser.parse_args(argv)
    except UsageError as exc:
        print(usage_line(exc, argv), file=sys.stderr)
        raise SystemExit(2) from None
    try:
        if getattr(args, "set", None):  # every knob checked before the command reads or writes anything
            check_overrides(args.set)
        code = int(args.func(args) or 0)
        sys.stdout.flush()  # a closed pipe shows here, not at exit
    except BrokenPipeError:  # the reader went away (`lucid queue | head -1`): what it wanted was printed
        _quiet_stdout()
        return 0
    except expected_errors() as exc:  # one line, saying too where a new store was made (the likely cause)
        note = _new_store_note(args)
        name = argv[0]  # not args.command: `submit` has a positional of that name, the job's command line
        print(f"lucid {name}: error: {error_line(exc)}" + (f"; {note}" if note else ""), file=sys.stderr)
        return 2
    note = _new_store_note(args)
    if note:
        print(f"lucid: {note}", file=sys.stderr)
    return code


def _new_store_note(args: argparse.Namespace) -> str | None:
    """`new_store_note` of a live-scheduler command (None for the others, which open no store)."""
    if getattr(args, "new_store", None) is None:
        return None
    from lucid_core.runtime.surfaces.cli.context import new_store_note

    return new_store_note(args)


def _quiet_stdout() -> None:
    """Point stdout at /dev/null, so that Python's flush at exit writes into no closed pipe (and says nothing)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # a stdout without a file descriptor (a test's capture): nothing to flush
        pass


if __name__ == "__main__":
    sys.exit(main())
