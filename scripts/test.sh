#!/usr/bin/env bash
# README command two: set up (if needed), start what the tests use, run the whole suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/services.sh
export LUCID_SHARED_DATA=${LUCID_SHARED_DATA:-$(cd .. && pwd)/shared/data}
exec .venv/bin/python -m pytest "$@"
