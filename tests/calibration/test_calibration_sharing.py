"""`lucid calibrate --sharing mps` under an emulated MPS daemon, and the clean stop at a time limit.

Both run the kit on this machine (`--host local`) with the torch-free workload double and emulated
telemetry. The MPS control binary is a shell script put first on PATH: it records every call and
its environment, `-d` makes the control pipe, `quit` removes it, `get_server_list` answers while it exists.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from lucid_core.calibration.catalog import catalog_sharing_key
from lucid_core.calibration.cli import EXIT_STOPPED, main
from lucid_core.calibration.journal import JOURNAL_NAME, Journal
from lucid_core.models.datasets import shared_data_dir
from lucid_core.runtime.hosts.executor import HostAddress
from lucid_core.runtime.hosts.local_executor import local_executor

REPO = Path(__file__).resolve().parents[2]
ARTIFACT = shared_data_dir() / "lucid_artifact" / "single_data.csv"
FAKE = "calibration_fake_workload"

FAKE_MPS_CONTROL = r"""#!/bin/sh
# test double of nvidia-cuda-mps-control: records each call, keeps the "daemon" as the control pipe
pipe=${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}
if [ "${1:-}" = -d ]; then cmd=-d; else read -r cmd || cmd=; fi
printf '{"event": "mps", "command": "%s", "CUDA_VISIBLE_DEVICES": "%s", "CUDA_MPS_PIPE_DIRECTORY": "%s", ' \
  "$cmd" "${CUDA_VISIBLE_DEVICES:-}" "${CUDA_MPS_PIPE_DIRECTORY:-}" >> "$LUCID_FAKE_EVENT_LOG"
printf '"CUDA_MPS_LOG_DIRECTORY": "%s", "time": %s}\n' "${CUDA_MPS_LOG_DIRECTORY:-}" "$(date +%s.%N)" \
  >> "$LUCID_FAKE_EVENT_LOG"
case "$cmd" in
  -d) [ -p "$pipe/control" ] && { echo "An instance of this daemon is already running" >&2; exit 1; }
      mkfifo "$pipe/control" && echo started > "$CUDA_MPS_LOG_DIRECTORY/control.log" ;;
  get_server_list) [ -p "$pipe/control" ] || { echo "Cannot find MPS control daemon process" >&2; exit 1; } ;;
  quit) [ -p "$pipe/control" ] || exit 1; rm -f "$pipe/control" ;;
  *) echo "unknown command $cmd" >&2; exit 1 ;;
esac
"""


@pytest.fixture(scope="module")
def artifact() -> Path:
    if not ARTIFACT.is_file():
        pytest.skip(f"reference catalog {ARTIFACT} missing (set LUCID_SHARED_DATA)")
    return ARTIFACT


def _args(tmp_path: Path, workloads: str, *more: str, seconds: str = "0.3") -> list[str]:
    """A short local calibration with the workload double and emulated telemetry."""
    gpu = tmp_path / "gpu"
    gpu.mkdir(exist_ok=True)
    return ["--host", "local", "--gpus", "0", "--workloads", workloads, "--seconds", seconds, "--warmup", "0.05",
            "--startup", "1", "--hold", "0.1", "--interval", "0.05", "--threads", "1", "--emulate", str(ARTIFACT),
            "--gpu-memory-mb", "24576", "--out", str(tmp_path / "catalog"), "--workdir", str(tmp_path / "runs"),
            "--pythonpath", f"{REPO}{os.pathsep}{REPO / 'tests' / 'calibration'}", "--workload-module", FAKE,
            "--env", f"LUCID_FAKE_GPU_DIR={gpu}", "--env", f"LUCID_FAKE_PROFILES={ARTIFACT}", "--no-progress",
            *more]


def _events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_mps_sharing_runs_every_run_under_a_daemon_the_kit_starts_and_quits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], artifact: Path) -> None:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    control = bindir / "nvidia-cuda-mps-control"
    control.write_text(FAKE_MPS_CONTROL, encoding="utf-8")
    control.chmod(0o755)
    events = tmp_path / "events.jsonl"
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("LUCID_FAKE_EVENT_LOG", str(events))

    code = main(_args(tmp_path, "ppo:32", "--sharing", "mps"))
    assert code == 0, capsys.readouterr().err

    seen = _events(events)
    mps_dir = (tmp_path / "runs" / "mps-gpu0").resolve()
    pipe, log = str(mps_dir / "pipe"), str(mps_dir / "log")
    commands = [e["command"] for e in seen if e["event"] == "mps"]
    assert commands.count("-d") == 1 and commands.count("quit") == 1
    start = next(i for i, e in enumerate(seen) if e.get("command") == "-d")
    runs = [i for i, e in enumerate(seen) if e["event"] in {"env", "run"}]
    quit_at = max(i for i, e in enumerate(seen) if e.get("command") == "quit")
    assert len(runs) == 1 + 1 + 2  # the environment probe, the solo, the self-pair's two processes
    assert start < min(runs) and quit_at > max(runs)  # the daemon was up before the first run, quit after the last
    assert seen[start]["CUDA_VISIBLE_DEVICES"] == "0"  # no nvidia-smi here: the GPU by index
    assert (seen[start]["CUDA_MPS_PIPE_DIRECTORY"], seen[start]["CUDA_MPS_LOG_DIRECTORY"]) == (pipe, log)
    for e in seen:  # every workload process and every control call found the daemon's directories
        assert (e["CUDA_MPS_PIPE_DIRECTORY"], e["CUDA_MPS_LOG_DIRECTORY"]) == (pipe, log)
    for directory in (mps_dir, mps_dir / "pipe", mps_dir / "log"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert not (mps_dir / "pipe" / "control").exists()  # quit

    out = tmp_path / "catalog"
    environment = json.loads((out / "environment.json").read_text(encoding="utf-8"))
    assert environment["sharing"] == "mps" and environment["gpu_model"] == "emulated"
    assert environment["telemetry"] == "emulated"  # the emulation marker stays
    assert catalog_sharing_key(out) == ("emulated", "mps")
    assert len(Journal.open(out).pairs) == 1


def test_mps_sharing_without_the_control_binary_fails_clearly_before_measuring(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], artifact: Path) -> None:
    if shutil.which("nvidia-cuda-mps-control"):
        pytest.skip("this machine has nvidia-cuda-mps-control: the missing-binary error cannot be shown here")
    code = main(_args(tmp_path, "ppo:32", "--sharing", "mps"))
    err = capsys.readouterr().err
    assert code == 1
    assert "no nvidia-cuda-mps-control on its PATH" in err and "--sharing time-slice" in err
    assert "Traceback" not in err
    out = tmp_path / "catalog"
    assert not (out / JOURNAL_NAME).exists() and not (out / "environment.json").exists()
    runs = tmp_path / "runs"
    assert not runs.exists() or not [p for p in runs.iterdir() if p.name.startswith("calib-")]  # nothing launched


def test_a_stop_signal_stops_the_runs_keeps_the_journal_and_the_same_command_resumes(
        tmp_path: Path, artifact: Path) -> None:
    command = [sys.executable, "-m", "lucid_core.calibration.cli", *_args(tmp_path, "ppo:32,neumf:64", seconds="0.5")]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    journal = tmp_path / "catalog" / JOURNAL_NAME
    kit = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=REPO,
                           start_new_session=True)
    try:
        deadline = time.monotonic() + 20.0
        while not (journal.is_file() and journal.read_text(encoding="utf-8").endswith("\n")):
            assert kit.poll() is None and time.monotonic() < deadline, "the first run was never journalled"
            time.sleep(0.02)
        # as `timeout --signal=INT` does: the kit, then its whole process group (the kit sees it twice)
        os.kill(kit.pid, signal.SIGINT)
        os.killpg(kit.pid, signal.SIGINT)
        _out, err = kit.communicate(timeout=30)
    finally:
        if kit.poll() is None:
            kit.kill()
            kit.wait()
    assert kit.returncode == EXIT_STOPPED, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    lines = [line for line in err.splitlines() if "stopped by SIGINT" in line]
    assert len(lines) == 1, err
    counted = re.fullmatch(r"lucid calibrate: stopped by SIGINT \(a time limit or Ctrl-C\): measured (\d+) of 5 runs; "
                           r"rerun the same command to resume", lines[0])
    assert counted is not None, lines[0]
    kept = Journal.open(tmp_path / "catalog")
    assert int(counted.group(1)) == len(kept.solos) + len(kept.pairs) >= 1
    assert (tmp_path / "catalog" / "single_data.csv").is_file()

    # nothing the kit started is still running on the host
    host = HostAddress(name="local", executor="local", workdir=str(tmp_path / "runs"), python=sys.executable)
    run_ids = [p.name for p in (tmp_path / "runs").iterdir() if p.name.startswith("calib-")]
    executor = local_executor()
    states = executor.poll(host, run_ids)
    # NOPID: a launch the signal cut short before its wrapper started (nothing runs); it must stay so. RUNNING: a
    # wrapper that started after the kit's stop reached its run's directory, which runs no command and ends at once
    # as stopped (143); a run whose command ran would end with its own exit code and no stop
    time.sleep(2.0)
    later = executor.poll(host, run_ids)
    executor.close()
    assert run_ids and {s.state for s in states.values()} <= {"EXITED", "VANISHED", "NOPID", "RUNNING"}, states
    assert all(later[r].state == "NOPID" for r in run_ids if states[r].state == "NOPID"), later
    assert all((later[r].state, later[r].exit_code, later[r].stop_requested) == ("EXITED", 143, True)
               for r in run_ids if states[r].state == "RUNNING"), (states, later)

    again = subprocess.run(command, capture_output=True, text=True, env=env, cwd=REPO, timeout=60, check=False)
    assert again.returncode == 0, again.stderr
    done = len(kept.solos) + len(kept.pairs)
    assert f"measured {5 - done} runs, {done} already in the journal" in again.stdout
    final = Journal.open(tmp_path / "catalog")
    assert len(final.solos) == 2 and len(final.pairs) == 3
    for key, solo in kept.solos.items():  # resumed: what was measured before the stop was not measured again
        assert final.solos[key].run_id == solo.run_id
