#!/usr/bin/env bash
# README command one: set up (if needed) and run the main job on the embedded default.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# a local Airflow (SQLite, on 127.0.0.1), emulated GPU hosts, seeded history, a sample workload scheduled to the
# end, the Update Engine trained and checked for drift (alert mail to a local SMTP sink); signals stop it all
exec .venv/bin/python scripts/demo.py "$@"
