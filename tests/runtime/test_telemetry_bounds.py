"""A watching agent's file stays bounded while the profile and the speed estimate read from it stay exact.

The agent runs the emulated backend on a simulated clock for a long job (tens of thousands of samples)
that shares a GPU for some stretches and runs alone for others; beside the bounded file it keeps the
full record, and the round's two reads (the whole file for the profile, its tail for the speed) must
give what the full record gives.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lucid_core.runtime.hosts import telemetry_agent
from lucid_core.runtime.hosts.telemetry import (
    bounded_file_bytes,
    estimate_shared_speed,
    first_window,
    parse_samples,
    summarize,
)
from lucid_core.runtime.hosts.telemetry_agent import (
    KEPT_WATCH_BYTES,
    RECORD_BYTES_BOUND,
    EmulatedBackend,
    EmulatedDeviceTable,
    TelemetryLog,
    sample_loop,
)
from lucid_core.runtime.round.pair_speed import TELEMETRY_TAIL_BYTES

WINDOW_S = 205.0  # the profile's window as the round reads it (tprof + margin)
KEPT_S = WINDOW_S + 1.0  # what the round tells the agent: one sample over
EXCLUSIVE_UTIL = 70.0


@pytest.fixture
def job_and_partner():
    procs = [subprocess.Popen(["sleep", "120"], start_new_session=True) for _ in range(2)]
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()


def tail_samples(path: Path) -> list[dict]:
    """What the round reads for the speed estimate: the last TELEMETRY_TAIL_BYTES of the file."""
    return parse_samples(path.read_bytes()[-TELEMETRY_TAIL_BYTES:].decode())


def test_a_long_watched_job_keeps_its_file_bounded_and_its_profile_and_speed_exact(tmp_path, job_and_partner):
    job, partner = job_and_partner
    table = EmulatedDeviceTable(str(tmp_path / ".emulated-gpus"))
    backend = EmulatedBackend([0, 1], gpu_util=EXCLUSIVE_UTIL, mem_util=80.0, mem_mb=1500.0, seed=5,
                              device_table=table)
    path = tmp_path / "telemetry.jsonl"
    log = TelemetryLog(str(path), keep_all_s=KEPT_S)
    full: list[dict] = []  # every sample, as an unbounded agent would have written it

    def write(record: dict) -> None:
        full.append(dict(record))
        log.write(record)

    # ticks of 1 s: alone, shared on GPU 0 from 3000, alone from 15000, shared again from 25000 to the end
    last_tick = 40_000
    shared_from = {3000: True, 15000: False, 25000: True}
    checks = {3100: [3060.0], 14999: [3060.0, 0.0], 20000: [3060.0], 25100: [25060.0], last_tick: [25060.0, 0.0]}
    ticks = iter(range(last_tick + 1))
    clock_now = [0.0]
    sizes: dict[int, int] = {}
    compared: list[float] = []

    def clock() -> float:
        clock_now[0] = float(next(ticks))
        return clock_now[0]

    def compare_speeds(tick: int) -> None:  # as a round would read them now
        for since in checks.get(tick, []):
            whole = estimate_shared_speed(full, EXCLUSIVE_UTIL, since=since)
            read = estimate_shared_speed(tail_samples(path), EXCLUSIVE_UTIL, since=since)
            assert whole is not None and read == whole, (tick, since)
            compared.append(whole.speed)

    def between_samples(_: float) -> None:  # the loop's sleep: the round reads, the partner comes and goes
        tick = int(clock_now[0])
        sizes[tick] = path.stat().st_size
        compare_speeds(tick)
        if tick + 1 in shared_from:
            if shared_from[tick + 1]:
                table.register(partner.pid, [0], 70.0, 80.0, 2500.0)
            else:
                os.remove(tmp_path / ".emulated-gpus" / f"{partner.pid}.json")

    written = sample_loop(backend, write, pid=job.pid, interval_s=1.0, duration_s=float(last_tick),
                          clock=clock, sleep=between_samples)
    log.close()
    sizes[last_tick] = path.stat().st_size
    compare_speeds(last_tick)
    assert written == len(full) == 2 * (last_tick + 1)

    # the profile: every sample of the window is in the file, at its front, so the round's read is exact
    window = first_window(full, WINDOW_S)
    assert len(window) == 2 * 206
    kept = parse_samples(path.read_text())
    assert first_window(kept, WINDOW_S) == window
    assert summarize(first_window(kept, WINDOW_S)) == summarize(window)

    # the speed estimate came out the same from the tail as from the full record, at every check
    assert len(compared) == 7 and min(compared) == pytest.approx(100 / 160, abs=0.04)

    # bounded: the window plus at most twice the kept speed samples, however long the job runs
    window_bytes = sum(len(json.dumps(r)) + 1 for r in full[: 2 * 207])
    assert max(sizes.values()) <= window_bytes + 2 * KEPT_WATCH_BYTES + RECORD_BYTES_BOUND
    assert max(sizes.values()) <= bounded_file_bytes(KEPT_S, 1.0, 2)
    full_bytes = sum(len(json.dumps(r)) + 1 for r in full)
    assert full_bytes > 20 * path.stat().st_size
    # alone after its window the job writes nothing; sharing, only GPU 0's speed samples
    assert sizes[2999] == sizes[250] and sizes[24999] == sizes[15001]
    after = kept[len(window) + 2:]
    assert after and all(r["gpu"] == 0 and r["others"] == 1 and r["t"] > KEPT_S for r in after)
    assert after[-1]["t"] == last_tick
    assert not (tmp_path / "telemetry.jsonl.tmp").exists()


def test_the_round_reads_enough_of_the_tail_for_the_estimates_latest_samples():
    """The tail the round reads holds the estimate's max_samples (120) rows even at the longest line,
    and the agent keeps at least that tail of speed samples after each compaction."""
    assert 120 * RECORD_BYTES_BOUND < TELEMETRY_TAIL_BYTES <= KEPT_WATCH_BYTES


def test_the_standalone_agent_bounds_its_file_when_told_its_window(tmp_path, job_and_partner):
    """Shipped as a file: with --keep-all-s an agent alone writes nothing after its window, and one
    sharing its GPU keeps writing speed samples within --watch-bytes."""
    script = tmp_path / "agent.py"
    script.write_text(Path(telemetry_agent.__file__).read_text())
    job, partner = job_and_partner
    EmulatedDeviceTable(str(tmp_path / "table")).register(partner.pid, [0], 70.0, 80.0, 2500.0)
    (tmp_path / "pid").write_text(str(job.pid))
    common = [sys.executable, "-I", str(script), "sample", "--pid-file", "pid", "--interval", "0.01",
              "--duration", "2", "--emulate", "70,80,1000", "--device-table", str(tmp_path / "table"),
              "--keep-all-s", "0.3", "--watch-bytes", "3000"]
    agents = {gpu: subprocess.Popen([*common, "--gpus", gpu, "--out", f"t{gpu}.jsonl"], cwd=tmp_path,
                                    stderr=subprocess.PIPE, text=True) for gpu in ("0", "1")}
    for agent in agents.values():
        assert agent.wait(timeout=30) == 0, agent.stderr.read() if agent.stderr else ""
    alone = parse_samples((tmp_path / "t1.jsonl").read_text())
    assert len(alone) >= 5 and all(r["t"] <= alone[0]["t"] + 0.3 for r in alone)
    shared_text = (tmp_path / "t0.jsonl").read_text()
    shared = parse_samples(shared_text)
    window = [r for r in shared if r["t"] <= shared[0]["t"] + 0.3]
    window_bytes = sum(len(line) + 1 for line in shared_text.splitlines()[: len(window)])
    assert len(shared_text) <= window_bytes + 2 * 3000 + RECORD_BYTES_BOUND
    assert shared[-1]["t"] >= shared[0]["t"] + 1.5  # still watching at the end
    after = shared[len(window):]
    assert after and all(r["others"] == 1 for r in after)
    assert after[0]["t"] > shared[0]["t"] + 0.6  # compaction dropped the oldest speed samples
