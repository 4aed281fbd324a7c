#!/usr/bin/env bash
# BENCHMARKS.md = the per-area result files under benchmarks/results/, in one page.
#   bash benchmarks/assemble.sh            # write BENCHMARKS.md
#   bash benchmarks/assemble.sh --check    # exit 1 if BENCHMARKS.md is not what the parts make (CI runs this)
# Edit the part files, not the page: a section written only into BENCHMARKS.md is lost at the next assembly.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 - "$@" <<'PY'
import sys
from pathlib import Path

parts = ["preface", "simulator", "packing", "cli", "policy_shares", "policy_matrix", "pollux", "rooms", "runtime",
         "fleet", "lease", "models", "airflow", "calibration"]
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
page = "\n".join(out) + "\n"
if sys.argv[1:] not in ([], ["--check"]):
    sys.exit(f"usage: bash benchmarks/assemble.sh [--check] (not {' '.join(sys.argv[1:])})")
unlisted = sorted({p.stem for p in Path("benchmarks/results").glob("*.md")} - set(parts))
if unlisted:
    sys.exit(f"benchmarks/results/ has parts the page leaves out: {unlisted}; list them in assemble.sh")
if sys.argv[1:] == ["--check"]:
    if Path("BENCHMARKS.md").read_text(encoding="utf-8") != page:
        sys.exit("BENCHMARKS.md differs from benchmarks/results/*.md: edit the parts, then run bash benchmarks/assemble.sh")
    print("BENCHMARKS.md matches its parts")
else:
    Path("BENCHMARKS.md").write_text(page, encoding="utf-8")
PY
