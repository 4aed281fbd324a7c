"""Main runs on an MPS host become MPS clients of one daemon per GPU set, with no change to the job.

Real shell processes run the wrapped command; the driver's MPS control binary is emulated by a stand-in
on PATH that records its calls (no GPU here), as the records say."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from lucid_core.runtime.hosts.mps import mps_client_command, pinned_limit

STAND_IN = """#!/bin/sh
pipe="${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}"
echo "$* $CUDA_VISIBLE_DEVICES" >> "$CALLS"
if [ "${1:-}" = "-d" ]; then : > "$pipe/control"; exit 0; fi
[ -e "$pipe/control" ] || exit 1
while read -r cmd; do
  case "$cmd" in quit) rm -f "$pipe/control" ;; get_server_list) echo 4242 ;; esac
done
"""


def _stand_in(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-cuda-mps-control"
    fake.write_text(STAND_IN)
    fake.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "CALLS": str(tmp_path / "calls")}


def test_two_clients_share_one_daemon_that_quits_after_the_last(tmp_path):
    env = _stand_in(tmp_path)
    workdir = str(tmp_path / "runs")
    job = 'echo "$CUDA_MPS_PIPE_DIRECTORY|$CUDA_MPS_LOG_DIRECTORY|${CUDA_MPS_PINNED_DEVICE_MEM_LIMIT:-none}"; sleep {s}'
    first = subprocess.Popen(["sh", "-c", mps_client_command(job.replace("{s}", "2"), workdir, [1], "r1", 1536.0)],
                             env=env, stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    second = subprocess.Popen(["sh", "-c", mps_client_command(job.replace("{s}", "0.2"), workdir, [1], "r2", None)],
                              env=env, stdout=subprocess.PIPE, text=True)
    out_second, _ = second.communicate(timeout=30)
    pipe = Path(workdir) / ".mps" / "gpus-1" / "pipe"
    assert (pipe / "control").exists()  # the first client still runs: the daemon stays
    out_first, _ = first.communicate(timeout=30)
    assert first.returncode == 0 and second.returncode == 0
    assert out_first.strip() == f"{pipe}|{pipe.parent / 'log'}|0=1536M"
    assert out_second.strip() == f"{pipe}|{pipe.parent / 'log'}|none"  # not profiled yet: no limit guessed
    calls = (tmp_path / "calls").read_text().splitlines()
    assert [c for c in calls if c.startswith("-d")] == ["-d 1"]  # one daemon, for GPU 1 only
    assert not (pipe / "control").exists()  # quit once the last client ended
    assert oct((pipe.parent).stat().st_mode & 0o777) == "0o700"


def test_a_job_failure_keeps_its_exit_code_and_a_missing_daemon_fails_the_run_clearly(tmp_path):
    env = _stand_in(tmp_path)
    done = subprocess.run(["sh", "-c", mps_client_command("exit 3", str(tmp_path / "r"), [0], "r1", 100.0)],
                          env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 3
    no_binary = {**os.environ, "PATH": "/usr/bin:/bin"}
    done = subprocess.run(["sh", "-c", mps_client_command("echo ran", str(tmp_path / "s"), [0], "r2", None)],
                          env=no_binary, capture_output=True, text=True, timeout=60)
    assert done.returncode == 97 and "ran" not in done.stdout
    assert "MPS control daemon did not start" in done.stderr


def test_memory_limits_name_each_visible_device():
    assert pinned_limit(2, 2047.6) == "0=2048M,1=2048M"
    assert pinned_limit(1, None) is None and pinned_limit(1, 0) is None


def test_the_daemon_never_carries_the_runs_marker_and_a_trailing_comment_is_harmless(tmp_path):
    env = {**_stand_in(tmp_path), "LUCID_RUN_MARKER": "r1.abc"}
    bin_dir = tmp_path / "bin"
    recorded = 'echo "$* $CUDA_VISIBLE_DEVICES ${LUCID_RUN_MARKER:-none}" >> "$CALLS"'
    (bin_dir / "nvidia-cuda-mps-control").write_text(
        STAND_IN.replace('echo "$* $CUDA_VISIBLE_DEVICES" >> "$CALLS"', recorded))
    done = subprocess.run(["sh", "-c", mps_client_command("echo ran # a comment", str(tmp_path / "r"), [0], "r1",
                                                          None)], env=env, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0 and done.stdout.strip() == "ran", done.stderr
    starts = [c for c in (tmp_path / "calls").read_text().splitlines() if c.startswith("-d")]
    assert starts == ["-d 0 none"]
