#!/usr/bin/env bash
# README command two: set up (if needed), start what the tests use, run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/services.sh
export LUCID_SHARED_DATA=${LUCID_SHARED_DATA:-$(cd .. && pwd)/shared/data}
# most tests wait on real processes (sshd hosts, Airflow, rounds): 4 workers finish in about half the time on
# 2 cores (LUCID_TEST_WORKERS=0 runs in one process); --dist loadgroup keeps each xdist_group (tests sharing
# machine-wide state, such as the run-as OS users) on one worker
exec .venv/bin/python -m pytest -n "${LUCID_TEST_WORKERS:-4}" --dist loadgroup "$@"
