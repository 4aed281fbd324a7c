"""`scripts/gpu_live_check.sh` rehearsed without a GPU: calibration under a stand-in MPS control, the tree
promoted for its key, two light jobs profiled, paired on the MPS host and completed by real rounds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_the_live_check_passes_its_dry_rehearsal(tmp_path):
    env = {**os.environ, "LUCID_GPU_CHECK_DRY": "1", "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(REPO / "scripts" / "gpu_live_check.sh"), str(tmp_path / "out")], env=env,
                          capture_output=True, text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith(("PASS", "FAIL"))]
    assert done.returncode == 0, "\n".join(lines) + done.stderr[-2000:]
    names = [line.split()[1].rstrip(":") for line in lines]
    assert names[:4] == ["calibrate", "train-packing", "jobs-complete", "paired"], lines
    assert all(line.startswith("PASS") for line in lines), lines
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["dry"] and summary["paired"] and set(summary["jobs"].values()) == {"COMPLETED"}
    environment = json.loads((tmp_path / "out" / "catalog" / "environment.json").read_text())
    assert environment["sharing"] == "mps"
