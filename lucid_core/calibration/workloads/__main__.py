"""Command line of one workload process: ``python -m lucid_core.calibration.workloads run ...``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from lucid_core.calibration.workloads import WORKLOADS


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m lucid_core.calibration.workloads",
                                     description="Run one calibration workload and print its speed.")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="print the workloads, their catalog names and batch sizes")
    run = sub.add_parser("run", help="train on generated data for a wall-clock window and report iterations/s")
    run.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    run.add_argument("--batch-size", type=int, required=True)
    run.add_argument("--amp", action="store_true", help="mixed precision (fp16 on CUDA, bf16 on the CPU)")
    run.add_argument("--device", default="auto", help="auto (CUDA if available, else CPU), cpu, cuda, cuda:1 ...")
    run.add_argument("--seconds", type=float, default=60.0, help="length of the measured window")
    run.add_argument("--warmup", type=float, default=3.0, help="minimum warm-up seconds before measuring")
    run.add_argument("--sync-dir", default=None, help="directory where co-located processes meet before measuring")
    run.add_argument("--parties", type=int, default=1, help="processes that meet in --sync-dir (2 for a pair)")
    run.add_argument("--hold", type=float, default=0.0, help="seconds to keep training, unmeasured, after the window")
    run.add_argument("--start-margin", type=float, default=0.5,
                     help="seconds between the last partner being ready and the common start")
    run.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    run.add_argument("--tag", default="", help="label echoed in the result (tells co-located processes apart)")
    sub.add_parser("env", help="print the software and GPU this host would measure with")
    return parser


def environment() -> dict[str, object]:
    """torch, CUDA, cuDNN, Python and, when NVML answers, the driver and GPU names."""
    import platform

    import torch

    env: dict[str, object] = {
        "event": "env", "python": platform.python_version(), "torch": torch.__version__,
        "cuda": torch.version.cuda or "", "cuda_available": torch.cuda.is_available(),
        "cudnn": str(torch.backends.cudnn.version() or ""), "hostname": platform.node(),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
    }
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import pynvml
        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        env["driver"] = driver.decode() if isinstance(driver, bytes) else str(driver)
        pynvml.nvmlShutdown()
    except Exception as exc:  # no NVML library or no GPU: say why instead of failing
        env["driver"] = ""
        env["nvml_error"] = f"{type(exc).__name__}: {exc}"
    return env


def emit_line(text: str) -> None:
    """One write per record, so two processes sharing a log file never tear each other's lines."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "list":
        for w in WORKLOADS.values():
            amp = "amp" if w.amp else "no-amp"
            print(f"{w.name:12s} {w.model}/{w.dataset}  batch sizes {list(w.batch_sizes)}  {amp}  per {w.unit}")
        return 0
    if args.command == "env":
        import json

        from lucid_core.calibration.workloads.protocol import PREFIX

        emit_line(PREFIX + json.dumps(environment(), sort_keys=True))
        return 0
    import torch

    from lucid_core.calibration.workloads.loop import measure
    from lucid_core.calibration.workloads.timing import LoopTiming

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    timing = LoopTiming(seconds=args.seconds, warmup_s=args.warmup, sync_dir=args.sync_dir, parties=args.parties,
                        tag=args.tag, hold_s=args.hold, start_margin_s=args.start_margin)
    measure(args.workload, args.batch_size, args.amp, args.device, timing, emit=emit_line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
