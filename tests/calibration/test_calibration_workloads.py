"""Calibration workloads on the CPU build of torch, their command line, and the co-location barrier."""

from __future__ import annotations

import math
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lucid_core.calibration.configs import WorkloadConfig, all_pairs, parse_configs
from lucid_core.calibration.workloads import WORKLOADS, get_workload
from lucid_core.calibration.workloads.protocol import parse_events, parse_result
from lucid_core.calibration.workloads.timing import LoopTiming, run_timed

REPO = Path(__file__).resolve().parents[2]


def _torch():
    try:
        import torch
    except ImportError as exc:  # torch is the optional 'workloads' extra
        pytest.skip(f"torch not installed ({exc}); install the 'workloads' extra: pip install torch==2.13.0")
    torch.set_num_threads(1)
    return torch


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_each_workload_trains_a_few_iterations_on_the_cpu(name: str) -> None:
    torch = _torch()
    info = get_workload(name)
    torch.manual_seed(0)
    step = info.builder()(batch_size=2, device=torch.device("cpu"), amp=False)
    if name != "ppo":
        losses = [float(step()) for _ in range(2)]
        assert all(math.isfinite(v) for v in losses), losses
    else:  # ppo acts once per call and updates once per 256-step rollout; it returns the last update's loss
        losses = [float(step()) for _ in range(300)]
        assert losses[0] == 0.0 and losses[-1] != 0.0 and math.isfinite(losses[-1])


@pytest.mark.parametrize("name", ["resnet18", "lstm"])
def test_amp_variant_runs_in_bf16_on_the_cpu(name: str) -> None:
    torch = _torch()
    step = get_workload(name).builder()(batch_size=2, device=torch.device("cpu"), amp=True)
    assert math.isfinite(float(step()))


def test_ppo_refuses_amp() -> None:
    with pytest.raises(ValueError, match="no AMP"):
        WorkloadConfig("ppo", 32, amp=True)


def test_workload_process_prints_parseable_progress_and_result() -> None:
    _torch()
    done = subprocess.run(
        [sys.executable, "-m", "lucid_core.calibration.workloads", "run", "--workload", "neumf", "--batch-size", "8",
         "--seconds", "1.2", "--warmup", "0", "--threads", "1", "--tag", "A"],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=True)
    events = parse_events(done.stdout)
    assert any(e["event"] == "progress" for e in events), done.stdout
    result = parse_result(done.stdout, "A")
    assert result.workload == "neumf" and result.batch_size == 8 and result.device == "cpu"
    assert result.iterations > 0 and result.seconds >= 1.2
    assert result.iters_per_s == pytest.approx(result.iterations / result.seconds, rel=1e-3)
    assert result.samples_per_s == pytest.approx(8 * result.iters_per_s)


def test_barrier_makes_partners_measure_the_same_window(tmp_path: Path) -> None:
    """A partner that warms up much longer delays the other's window instead of leaving it alone."""
    windows: dict[str, tuple[int, float, float]] = {}

    def worker(tag: str, warmup: float) -> None:
        timing = LoopTiming(seconds=0.4, warmup_s=warmup, sync_dir=str(tmp_path), parties=2, tag=tag, hold_s=0.1,
                            start_margin_s=0.05)
        windows[tag] = run_timed(lambda: time.sleep(0.002), lambda: None, timing, lambda _line: None)

    threads = [threading.Thread(target=worker, args=("A", 0.0)), threading.Thread(target=worker, args=("B", 0.6))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    (_, a0, a1), (_, b0, b1) = windows["A"], windows["B"]
    assert abs(a0 - b0) < 0.05  # both started at the agreed time, not when each was warm
    overlap = (min(a1, b1) - max(a0, b0)) / max(a1 - a0, b1 - b0)
    assert overlap > 0.85


def test_barrier_gives_up_when_a_partner_never_comes(tmp_path: Path) -> None:
    from lucid_core.calibration.workloads.timing import PartnerMissing

    timing = LoopTiming(seconds=0.1, warmup_s=0.0, sync_dir=str(tmp_path), parties=2, tag="A",
                        barrier_timeout_s=0.2)
    with pytest.raises(PartnerMissing, match="1 of 2"):
        run_timed(lambda: time.sleep(0.001), lambda: None, timing, lambda _line: None)


def test_workload_specs_parse_and_pairs_include_self_pairs() -> None:
    configs = parse_configs(["resnet18:64:amp,neumf", "ppo:32", "neumf:64"])
    assert configs == [WorkloadConfig("resnet18", 64, True), WorkloadConfig("neumf", 64, False),
                       WorkloadConfig("ppo", 32, False)]
    pairs = all_pairs(configs)
    assert len(pairs) == 6 and (configs[0], configs[0]) in pairs
    with pytest.raises(ValueError, match="unknown workload"):
        parse_configs(["bert:32"])


def _nvml_works() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return False
    pynvml.nvmlShutdown()
    return True


def test_calibrate_command_line_validates_and_explains_a_host_without_gpu(tmp_path: Path, capsys) -> None:
    import argparse

    from lucid_core.calibration.cli import add_parser, main

    parser = argparse.ArgumentParser(prog="lucid")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["calibrate", "--host", "gpu1", "--workloads", "resnet18:32", "neumf", "--out", "x"])
    assert args.seconds == 60.0 and args.gpus == "0" and args.workloads == ["resnet18:32", "neumf"]

    assert main(["--host", "local", "--gpus", "0,1", "--workloads", "ppo", "--out", str(tmp_path)]) == 2
    assert main(["--host", "local", "--workloads", "bert:32", "--out", str(tmp_path)]) == 2
    assert "unknown workload 'bert'" in capsys.readouterr().err
    _torch()
    if _nvml_works():
        pytest.skip("this machine has a working NVML: the no-GPU messages cannot be shown here")
    code = main(["--host", "local", "--workloads", "ppo:32", "--out", str(tmp_path / "cat"),
                 "--workdir", str(tmp_path / "runs"), "--no-progress"])
    assert code == 1
    err = capsys.readouterr().err
    assert "no working NVML" in err and "--emulate" in err  # no NVIDIA GPU here: says what to do instead
    code = main(["--host", "local", "--workloads", "ppo:32", "--out", str(tmp_path / "cat"), "--emulate",
                 str(tmp_path / "missing.csv"), "--workdir", str(tmp_path / "runs"), "--no-progress"])
    assert code == 2 and "cannot read emulated profiles" in capsys.readouterr().err  # a clear error, no traceback
    sample = Path(__file__).resolve().parents[2] / "include" / "sample" / "single_data.csv"
    code = main(["--host", "local", "--workloads", "ppo:32", "--out", str(tmp_path / "cat"), "--emulate",
                 str(sample), "--workdir", str(tmp_path / "runs"), "--no-progress"])
    assert code == 1
    assert "--gpu-memory-mb" in capsys.readouterr().err  # no nvidia-smi to read the GPU's memory from
    assert not (tmp_path / "cat" / "environment.json").exists()  # nothing half-written before the memory check
