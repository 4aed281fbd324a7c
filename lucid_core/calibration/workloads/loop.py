"""Timed training loop shared by every workload: warm up, measure a wall-clock window, report."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack

import torch

from lucid_core.calibration.workloads.protocol import WorkloadResult
from lucid_core.calibration.workloads.timing import LoopTiming, run_timed


def resolve_device(name: str) -> torch.device:
    """'auto' picks CUDA when available, else the CPU; anything else is passed to torch."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def autocast(device: torch.device, amp: bool) -> AbstractContextManager[object]:
    """Mixed precision for the forward pass: fp16 on CUDA, bf16 on the CPU; a no-op when off. On a CPU
    whose oneDNN has no bf16 kernels (no AVX-512), oneDNN is kept out of the pass: its bf16 LSTM has no
    primitive there and fails, while torch's own kernels run bf16 on any CPU."""
    dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
    cast = torch.autocast(device_type=device.type, dtype=dtype, enabled=amp)
    if not (amp and device.type == "cpu") or torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return cast
    stack = ExitStack()
    stack.enter_context(torch.backends.mkldnn.flags(enabled=False))
    stack.enter_context(cast)
    return stack


def grad_scaler(device: torch.device, amp: bool) -> torch.amp.GradScaler:
    """Loss scaling for fp16 AMP on CUDA (bf16 on the CPU needs none)."""
    return torch.amp.GradScaler(device.type, enabled=amp and device.type == "cuda")


def synchronizer(device: torch.device) -> Callable[[], None]:
    """Wait for the device's queued work (CUDA), so each timed iteration has really finished."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def measure(name: str, batch_size: int, amp: bool, device_name: str, timing: LoopTiming,
            emit: Callable[[str], None] = print) -> WorkloadResult:
    """Build the named workload on the device, run the timed loop, emit and return the result record."""
    from lucid_core.calibration.workloads import get_workload

    info = get_workload(name)
    if amp and not info.amp:
        raise ValueError(f"workload {name!r} has no AMP variant")
    device = resolve_device(device_name)
    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True  # as most training scripts do; the warm-up absorbs the autotuning
    step = info.builder()(batch_size=batch_size, device=device, amp=amp)
    iters, start, end = run_timed(step, synchronizer(device), timing, emit)
    elapsed = max(end - start, 1e-9)
    result = WorkloadResult(
        workload=name, batch_size=batch_size, amp=amp, device=str(device), iterations=iters,
        seconds=round(elapsed, 4), iters_per_s=iters / elapsed, samples_per_s=iters * batch_size / elapsed,
        measure_start=start, measure_end=end, torch_version=torch.__version__,
        gpu_name=torch.cuda.get_device_name(device) if device.type == "cuda" else "", tag=timing.tag,
    )
    emit(result.to_line())
    return result
