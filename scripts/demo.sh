#!/usr/bin/env bash
# README command one: set up (if needed) and run the main job on the embedded default.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# a local Airflow (standalone, SQLite), emulated GPU hosts, a sample workload scheduled to the end
exec .venv/bin/python scripts/demo.py "$@"
