#!/usr/bin/env bash
# BENCHMARKS.md = the per-area result files under benchmarks/results/, in one page.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 - <<'PY'
from pathlib import Path

parts = ["simulator", "policy_matrix", "pollux", "runtime", "lease", "models", "airflow", "calibration"]
out = ["# Benchmarks", "",
       "Every figure below was produced on this project's 2-core development machine with the",
       "command given beside it; each section is also a file under `benchmarks/results/`",
       "(regenerate this page with `bash benchmarks/assemble.sh`). Reliability figures are in",
       "`RELIABILITY.md`."]
for part in parts:
    out.append("")
    fence = False
    for line in Path(f"benchmarks/results/{part}.md").read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
        out.append("#" + line if not fence and line.startswith("#") else line)
Path("BENCHMARKS.md").write_text("\n".join(out) + "\n", encoding="utf-8")
PY
