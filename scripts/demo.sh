#!/usr/bin/env bash
# README command one: set up (if needed) and run the main job on the embedded default.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/lucid simulate --start 2024-03-04T12:00 --nodes 3 --out out/demo "$@"
