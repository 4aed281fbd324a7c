#!/usr/bin/env bash
# Install what Lucid needs on a fresh Debian machine (idempotent): system packages, a venv, the project.
set -euo pipefail
cd "$(dirname "$0")/.."

# the servers the tests use (scripts/services.sh starts them) are packages too: a fresh machine may lack them
APT_PACKAGES=(openssh-server chromium sudo postgresql redis-server rabbitmq-server)
missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -eq 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
  else
    echo "setup: missing system packages ${missing[*]} (run as root or: sudo apt-get install ${missing[*]})" >&2
  fi
fi

PYTHON=${PYTHON:-}
if [ -z "$PYTHON" ]; then
  for candidate in python3.11 python3.12 python3; do
    if command -v "$candidate" >/dev/null 2>&1; then PYTHON=$candidate; break; fi
  done
fi
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.lucid-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  .venv/bin/python -m pip install -q --upgrade pip
  # the calibration workloads need torch; take the CPU build (pinned with its local version so
  # pip never falls back to the multi-GB CUDA build); without it those tests skip and say why
  .venv/bin/python -m pip install -q "torch==2.13.0+cpu" \
    || echo "setup: CPU torch 2.13.0 not available here; calibration workload tests will skip" >&2
  .venv/bin/python -m pip install -q -e ".[airflow,dev]"
  touch "$stamp"
fi
