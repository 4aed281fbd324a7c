"""Telemetry agent: emulated records say so, summaries, per-process memory attribution, standalone script."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

from lucid_core.runtime.hosts import telemetry_agent
from lucid_core.runtime.hosts.telemetry import parse_samples, summarize
from lucid_core.runtime.hosts.telemetry_agent import EmulatedBackend, NvmlBackend, sample_loop


def test_emulated_samples_all_say_emulated_and_summarize_to_the_catalog_profile():
    backend = EmulatedBackend([0, 1], gpu_util=40.0, mem_util=20.0, mem_mb=3000.0, seed=3)
    records = []
    ticks = iter(range(100))
    written = sample_loop(backend, records.append, pid=None, interval_s=1.0, duration_s=9.0,
                          clock=lambda: float(next(ticks)), sleep=lambda s: None)
    assert written == 20 and len(records) == 20  # 10 ticks x 2 GPUs
    assert all(r["emulated"] is True for r in records)
    summary = summarize(records)
    assert summary["emulated"] is True and summary["samples"] == 20
    assert abs(summary["gpu_util"] - 40.0) < 1.5 and abs(summary["mem_util"] - 20.0) < 1.0
    assert summary["gpu_mem_mb"] == 3000.0 and summary["window_s"] == 9.0


def test_a_watching_agent_slows_to_the_watch_interval_after_the_profiling_window():
    backend = EmulatedBackend([0], gpu_util=40.0, mem_util=20.0, mem_mb=3000.0, seed=1)
    clock = [0.0]
    records: list = []
    sample_loop(backend, records.append, pid=None, interval_s=1.0, duration_s=60.0,
                clock=lambda: clock[0], sleep=lambda s: clock.__setitem__(0, clock[0] + s),
                watch_interval_s=5.0, watch_after_s=10.0)
    times = [r["t"] for r in records]
    assert times[:11] == [float(t) for t in range(11)]  # every second through the window
    assert times[11:] == [float(t) for t in range(15, 61, 5)]  # then every 5 s


def test_summary_prefers_the_jobs_own_memory_and_skips_torn_lines():
    text = "\n".join([
        json.dumps({"t": 0, "gpu": 0, "gpu_util": 50, "mem_util": 10, "mem_used_mb": 9000, "job_mem_mb": 2000}),
        json.dumps({"t": 1, "gpu": 0, "gpu_util": 70, "mem_util": 30, "mem_used_mb": 9500, "job_mem_mb": 2500}),
        '{"t": 2, "gpu": 0, "gpu_u',
    ])
    summary = summarize(parse_samples(text))
    assert summary["samples"] == 2 and summary["gpu_util"] == 60 and summary["gpu_mem_mb"] == 2500
    assert summary["emulated"] is False
    no_process_info = summarize([{"gpu_util": 1, "mem_util": 1, "mem_used_mb": 700, "job_mem_mb": 0}])
    assert no_process_info["gpu_mem_mb"] == 700
    assert summarize([]) == {"samples": 0}


class FakeNvmlError(Exception):
    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value


def test_nvml_backend_attributes_memory_and_sm_util_to_the_jobs_process_group(monkeypatch):
    """Two co-located jobs on GPU 0: only the processes in our job's process group count."""
    mine = subprocess.Popen(["sleep", "30"], start_new_session=True)
    other = subprocess.Popen(["sleep", "30"], start_new_session=True)
    asked_since: list[int] = []
    process_samples: list[object] = [
        types.SimpleNamespace(pid=mine.pid, timeStamp=2_000_000_000_000_000, smUtil=40, memUtil=9),
        types.SimpleNamespace(pid=mine.pid, timeStamp=2_000_000_000_500_000, smUtil=50, memUtil=9),
        types.SimpleNamespace(pid=other.pid, timeStamp=2_000_000_000_400_000, smUtil=30, memUtil=5)]

    def process_utilization(handle, since):
        asked_since.append(since)
        if isinstance(process_samples, Exception):
            raise process_samples
        return process_samples

    try:
        fake = types.SimpleNamespace(
            NVMLError=FakeNvmlError, NVML_SUCCESS=0, NVML_ERROR_NOT_FOUND=6, NVML_ERROR_NOT_SUPPORTED=3,
            nvmlInit=lambda: None, nvmlShutdown=lambda: None,
            nvmlDeviceGetHandleByIndex=lambda i: f"gpu{i}",
            nvmlDeviceGetUtilizationRates=lambda h: types.SimpleNamespace(gpu=81, memory=33),
            nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(used=6000 * 2**20),
            nvmlDeviceGetComputeRunningProcesses=lambda h: [
                types.SimpleNamespace(pid=mine.pid, usedGpuMemory=2000 * 2**20),
                types.SimpleNamespace(pid=other.pid, usedGpuMemory=4000 * 2**20)],
            nvmlDeviceGetProcessUtilization=process_utilization,
        )
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        backend = NvmlBackend([0])
        [record] = backend.sample(job_pgid=os.getpgid(mine.pid))
        assert record == {"gpu": 0, "gpu_util": 81.0, "mem_util": 33.0, "mem_used_mb": 6000.0,
                          "job_mem_mb": 2000.0, "job_sm_util": 45.0, "others": 1, "emulated": False}
        assert telemetry_agent.process_group_of(mine.pid) == mine.pid
        # the next read asks only for samples newer than the newest one seen
        process_samples = FakeNvmlError(6)  # NOT_FOUND: no process ran a kernel since then
        [idle] = backend.sample(job_pgid=os.getpgid(mine.pid))
        assert asked_since[-1] == 2_000_000_000_500_000
        assert idle["job_sm_util"] == 0.0 and idle["others"] == 1
        process_samples = FakeNvmlError(3)  # NOT_SUPPORTED: no per-process figure at all
        [unsupported] = backend.sample(job_pgid=os.getpgid(mine.pid))
        assert unsupported["job_sm_util"] is None
        [foreign] = backend.sample(job_pgid=None)  # without the job's process group nothing is the job's
        assert foreign["job_sm_util"] is None and foreign["job_mem_mb"] == 0.0 and foreign["others"] == 2
    finally:
        mine.kill()
        other.kill()


def test_agent_runs_as_a_standalone_script_until_the_job_ends(tmp_path):
    """Shipped to a host as a plain file: no lucid_core on the path (python -I), stops with its job."""
    script = tmp_path / "agent.py"
    script.write_text(Path(telemetry_agent.__file__).read_text())
    job = subprocess.Popen(["sleep", "0.6"], start_new_session=True)
    (tmp_path / "pid").write_text(str(job.pid))
    out = tmp_path / "t.jsonl"
    done = subprocess.run([sys.executable, "-I", str(script), "sample", "--pid-file", str(tmp_path / "pid"),
                           "--gpus", "0", "--interval", "0.1", "--duration", "30", "--emulate", "30,10,1234",
                           "--out", str(out)], cwd=tmp_path, capture_output=True, text=True, timeout=20)
    job.wait()
    assert done.returncode == 0, done.stderr
    samples = parse_samples(out.read_text())
    assert 3 <= len(samples) <= 12 and all(s["emulated"] for s in samples)
