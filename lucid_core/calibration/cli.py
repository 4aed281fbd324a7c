"""`lucid calibrate`: measure the workloads alone and in pairs on one GPU of a host, write a packing catalog.

    lucid calibrate --host gpu1 --gpus 0 --workloads resnet18:32,neumf:64,ppo:32 --seconds 60 --out cat/
    lucid models train-packing --catalog cat/

`--host local` (or localhost) runs on this machine through the local executor; any other host is
reached over SSH with verified host keys (the runtime's executor). The host needs the
`workloads` extra (torch) and lucid_core importable by --python (or on --pythonpath).

`--sharing mps` starts NVIDIA's MPS control daemon on the host (pipe and log directories under --workdir)
for the runs and quits it at the end; environment.json records the sharing and the GPU model.
A daemon started by a non-root account serves only that account's processes.
SIGINT or SIGTERM (e.g. `timeout --signal=INT`) stops the runs on the host, quits the daemon, keeps the
catalog measured so far and exits 3; rerunning the same command resumes.
Exit status: 0 done, 1 a run or the host failed, 2 bad arguments, 3 stopped by a signal.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

from lucid_core.calibration.catalog import SHARING_MECHANISMS
from lucid_core.calibration.configs import parse_configs
from lucid_core.calibration.workloads import WORKLOADS

LOCAL_NAMES = {"local", "localhost"}
EXIT_STOPPED = 3  # stopped by SIGINT/SIGTERM (a time limit): what was measured is kept, a rerun resumes


def _source_root() -> str:
    """The directory holding this lucid_core package (put on PYTHONPATH for local runs)."""
    return str(Path(__file__).resolve().parents[2])


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register `calibrate` on the `lucid` command line."""
    p = subparsers.add_parser("calibrate", help="measure exclusive and co-located speeds on a GPU; write a catalog",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--host", required=True, help="host name or address; 'local' runs on this machine")
    p.add_argument("--gpus", default="0", help="GPU index on the host to calibrate (one GPU per catalog)")
    p.add_argument("--sharing", choices=SHARING_MECHANISMS, default="time-slice",
                   help="how a pair shares the GPU: time-slice (the driver's default) or mps (the kit runs "
                        "nvidia-cuda-mps-control on the host for its runs)")
    p.add_argument("--workloads", nargs="+", required=True,
                   help=f"NAME[:BATCH[:amp]] items, comma- or space-separated; names: {', '.join(WORKLOADS)}")
    p.add_argument("--seconds", type=float, default=60.0, help="measured window per run")
    p.add_argument("--out", required=True, help="catalog directory (resumed if it already holds a journal)")
    p.add_argument("--warmup", type=float, default=5.0, help="warm-up seconds before the barrier")
    p.add_argument("--startup", type=float, default=20.0, help="expected process start seconds (for estimates)")
    p.add_argument("--hold", type=float, default=2.0, help="seconds each process trains on after its window")
    p.add_argument("--interval", type=float, default=1.0, help="NVML sampling interval in seconds")
    p.add_argument("--device", default="auto", help="torch device on the host (auto: CUDA if available)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads per process (0: default)")
    p.add_argument("--gpu-memory-mb", type=float, default=None,
                   help="GPU memory for the fit check (default: nvidia-smi's total on the host)")
    p.add_argument("--headroom-mb", type=float, default=512.0, help="memory kept free on top of both footprints")
    p.add_argument("--emulate", nargs="?", const="artifact", default=None, metavar="SINGLE_DATA_CSV",
                   help="emulated telemetry (no NVIDIA GPU): profiles from this single_data.csv "
                        "(default: the shared artifact catalog); speeds are still measured")
    p.add_argument("--compare-with", default=None, metavar="SINGLE_DATA_CSV",
                   help="write comparison.md: our labels against this reference catalog's")
    p.add_argument("--port", type=int, default=22)
    p.add_argument("--user", default="")
    p.add_argument("--key", default=None, help="SSH private key file")
    p.add_argument("--known-hosts", default=None, help="known_hosts file (default: LUCID_KNOWN_HOSTS or ~/.ssh)")
    p.add_argument("--python", default=None, help="python on the host (default: python3; local: this one)")
    p.add_argument("--pythonpath", default=None, help="PYTHONPATH on the host (local default: this source tree)")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                   help="extra environment for the workload processes on the host (repeatable)")
    p.add_argument("--workdir", default="~/.lucid-runs/calibration", help="run directories on the host")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--workload-module", default=None, help=argparse.SUPPRESS)  # a test double's module
    p.set_defaults(func=run_calibrate)
    return p


class _StopSignal:
    """Which stop signal arrived first (None: none yet)."""

    def __init__(self) -> None:
        self.signum: int | None = None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else "a signal"


@contextmanager
def _stop_on_signals() -> Iterator[_StopSignal]:
    """SIGINT and SIGTERM raise KeyboardInterrupt once; later ones are ignored so the clean-up can finish.

    `timeout` signals the kit and then its whole process group, so the kit sees the signal twice.
    Outside the main thread (no handlers there) it only yields.
    """
    stop = _StopSignal()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        if stop.signum is None:
            stop.signum = signum
            raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def run_calibrate(args: argparse.Namespace) -> int:
    """Run `lucid calibrate`; a stop signal ends it with EXIT_STOPPED and one line on stderr, no traceback."""
    with _stop_on_signals() as stop:
        try:
            return _calibrate(args, stop)
        except KeyboardInterrupt:  # before the runs began or after they ended
            print(f"lucid calibrate: stopped by {stop.name} outside the runs; rerun the same command to resume",
                  file=sys.stderr)
            return EXIT_STOPPED


def _calibrate(args: argparse.Namespace, stop: _StopSignal) -> int:
    from lucid_core.calibration.compare import compare_labels, comparison_markdown
    from lucid_core.calibration.emulation import EmulatedProfiles
    from lucid_core.calibration.harness import (
        CalibrationInterrupted,
        CalibrationSettings,
        CalibrationTarget,
        Calibrator,
        TrialFailed,
    )
    from lucid_core.calibration.mps import MpsUnavailable
    from lucid_core.runtime.hosts.executor import HostAddress, HostCommandFailed, HostUnreachable

    gpus = [g for g in str(args.gpus).split(",") if g.strip()]
    if len(gpus) != 1 or not gpus[0].strip().isdigit():
        print(f"lucid calibrate: error: --gpus takes one GPU index (a catalog is per GPU), got {args.gpus!r}",
              file=sys.stderr)
        return 2
    try:
        configs = parse_configs(args.workloads)
    except ValueError as exc:
        print(f"lucid calibrate: error: --workloads: {exc}", file=sys.stderr)
        return 2
    if any("=" not in item for item in args.env):
        print(f"lucid calibrate: error: --env takes NAME=VALUE, got {args.env}", file=sys.stderr)
        return 2
    extra_env = dict(item.split("=", 1) for item in args.env)
    local = args.host in LOCAL_NAMES
    host = HostAddress(name=args.host, address="127.0.0.1" if local else args.host, port=args.port, user=args.user,
                       key_path=args.key, workdir=args.workdir,
                       python=args.python or (sys.executable if local else "python3"),
                       executor="local" if local else "ssh")
    if local:
        from lucid_core.runtime.hosts.local_executor import local_executor

        executor = local_executor(timeout_s=60.0)
    else:
        from lucid_core.runtime.hosts.ssh_executor import ssh_executor

        executor = ssh_executor(args.known_hosts, timeout_s=60.0)
    emulation = None
    if args.emulate is not None:
        source = args.emulate
        if source == "artifact":
            from lucid_core.models.datasets import shared_data_dir

            source = str(shared_data_dir() / "lucid_artifact" / "single_data.csv")
        try:
            emulation = EmulatedProfiles.from_single_data(source)
        except (OSError, KeyError, ValueError) as exc:
            executor.close()
            print(f"lucid calibrate: error: cannot read emulated profiles from {source}: {exc!r}; give --emulate "
                  "PATH_TO_single_data.csv (or set LUCID_SHARED_DATA for the artifact's)", file=sys.stderr)
            return 2
    settings = CalibrationSettings(seconds=args.seconds, warmup_s=args.warmup, startup_s=args.startup,
                                   hold_s=args.hold, telemetry_interval_s=args.interval, device=args.device,
                                   threads=args.threads, gpu_memory_mb=args.gpu_memory_mb,
                                   memory_headroom_mb=args.headroom_mb,
                                   **({"workload_module": args.workload_module} if args.workload_module else {}))
    target = CalibrationTarget(host, int(gpus[0]), args.pythonpath or (_source_root() if local else None),
                               extra_env, sharing=args.sharing)
    calibrator = Calibrator(executor, target, args.out, settings, emulation,
                            progress=None if args.no_progress else sys.stderr)
    try:
        report = calibrator.run(configs)
    except CalibrationInterrupted as exc:
        print(f"lucid calibrate: stopped by {stop.name} (a time limit or Ctrl-C): measured {exc.measured} of "
              f"{exc.total} runs; rerun the same command to resume", file=sys.stderr)
        return EXIT_STOPPED
    except (TrialFailed, MpsUnavailable, HostUnreachable, HostCommandFailed) as exc:
        print(f"lucid calibrate: error: calibration stopped: {exc}", file=sys.stderr)
        return 1
    finally:
        executor.close()
    print(f"measured {len(report.measured)} runs, {len(report.skipped)} already in the journal, "
          f"{len(report.refused)} pairs refused (memory), {len(report.failed)} failed")
    for line in report.refused + report.failed:
        print(f"  {line}")
    if report.files is not None:
        print(f"catalog: {report.files.single} ({report.files.rows} configurations), "
              f"{report.files.colocate} ({report.files.pairs} pairs)")
    if args.compare_with and report.files is not None:
        text = comparison_markdown(compare_labels(args.out, args.compare_with), args.out, args.compare_with)
        (Path(args.out) / "comparison.md").write_text(text, encoding="utf-8")
        print(text)
    return 1 if report.failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m lucid_core.calibration.cli ...` without the rest of the `lucid` command line."""
    parser = argparse.ArgumentParser(prog="lucid")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["calibrate", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
