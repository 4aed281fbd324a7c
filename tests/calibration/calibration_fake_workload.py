"""Test double for the calibration workloads: a torch-free process sharing an emulated GPU by time-slicing.

Each step holds an exclusive lock on the GPU's lock file for `duty` of a short period (the
kernel time) and sleeps the rest (host-side work). Two processes on one lock contend only for
the locked part, so a pair of light jobs keeps its speed and a pair of busy ones slows down,
as on a real GPU. The duty is the configuration's GPU utilization in a reference catalog
(LUCID_FAKE_PROFILES). It speaks the real workload's command line and line protocol, and uses
the real timing code (barrier, window, hold). LUCID_FAKE_CRASH=name makes that workload fail;
LUCID_FAKE_EVENT_LOG=file makes each process append one JSON line with the CUDA variables it saw.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time

from lucid_core.calibration.configs import WorkloadConfig
from lucid_core.calibration.emulation import EmulatedProfiles
from lucid_core.calibration.workloads.__main__ import build_parser, emit_line
from lucid_core.calibration.workloads.protocol import PREFIX, WorkloadResult
from lucid_core.calibration.workloads.timing import LoopTiming, run_timed

PERIOD_S = 0.004
SEEN_VARIABLES = ("CUDA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")


def note_environment(command: str, workload: str) -> None:
    """Append what this process saw to LUCID_FAKE_EVENT_LOG (one write: processes share the file)."""
    path = os.environ.get("LUCID_FAKE_EVENT_LOG")
    if path:
        line = json.dumps({"event": command, "workload": workload, "time": time.time(),
                           **{name: os.environ.get(name) for name in SEEN_VARIABLES}})
        with open(path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")


def main() -> int:
    args = build_parser().parse_args()
    note_environment(args.command, getattr(args, "workload", ""))
    if args.command == "env":
        emit_line(PREFIX + json.dumps({"event": "env", "torch": "none (test double)", "driver": "", "gpus": []}))
        return 0
    if args.command != "run":
        return 2
    if os.environ.get("LUCID_FAKE_CRASH") == args.workload:
        print(f"{args.workload}: simulated crash", file=sys.stderr)
        return 3
    config = WorkloadConfig(args.workload, args.batch_size, args.amp)
    profiles = EmulatedProfiles.from_single_data(os.environ["LUCID_FAKE_PROFILES"])
    duty = min(1.0, profiles.solo(config)[0] / 100.0)
    lock_path = os.path.join(os.environ["LUCID_FAKE_GPU_DIR"], f"gpu{os.environ.get('CUDA_VISIBLE_DEVICES', '0')}")
    fd = os.open(lock_path, os.O_CREAT | os.O_RDWR, 0o644)

    def step() -> None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        time.sleep(duty * PERIOD_S)
        fcntl.flock(fd, fcntl.LOCK_UN)
        time.sleep((1.0 - duty) * PERIOD_S)

    timing = LoopTiming(seconds=args.seconds, warmup_s=args.warmup, sync_dir=args.sync_dir, parties=args.parties,
                        tag=args.tag, hold_s=args.hold, start_margin_s=args.start_margin)
    iters, start, end = run_timed(step, lambda: None, timing, emit_line)
    elapsed = end - start
    emit_line(WorkloadResult(workload=args.workload, batch_size=args.batch_size, amp=args.amp, device="emulated-gpu",
                             iterations=iters, seconds=elapsed, iters_per_s=iters / elapsed,
                             samples_per_s=iters * args.batch_size / elapsed, measure_start=start,
                             measure_end=end, torch_version="none", tag=args.tag).to_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
