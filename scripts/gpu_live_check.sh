#!/usr/bin/env bash
# Live check on one real NVIDIA GPU (about 6 minutes): GPU sharing under MPS, decided by what this GPU measured.
#
#   1. calibrate this GPU's model under MPS (two light workloads, every pair; the kit starts and quits the daemon);
#   2. train the packing tree on that catalog and promote it for (this GPU model, mps) into a fresh store;
#   3. register this machine twice (a profiling host, and a main host with --sharing mps) and submit two light
#      training jobs; rounds profile both with real NVML telemetry, pair them on the MPS host, and both complete.
#
# Prints PASS or FAIL lines and writes OUT/{catalog/, summary.json, check.log}. Exit 0 only when every check held.
#
# Usage:  bash scripts/gpu_live_check.sh [OUT]            (OUT defaults to $OUT, else out/gpu_live_check)
# Needs:  python3 with torch (CUDA) and pynvml, nvidia-cuda-mps-control on PATH, and lucid_core's runtime
#         dependencies (SQLAlchemy, alembic; on the lent device machine they travel as wheels, see below).
#
# On the lent device machine (it has torch, pandas, scikit-learn and nvidia-ml-py, not SQLAlchemy):
#   echo /.whl/ >> .git/info/exclude
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_17_x86_64 -d .whl sqlalchemy==2.0.* alembic mako greenlet
#   run(command="python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && \
#       PYTHONPATH=/tmp/site bash scripts/gpu_live_check.sh", carry=[".whl"], timeout_s=540)
#
# LUCID_GPU_CHECK_DRY=1 rehearses the whole script without a GPU (CI runs it): emulated telemetry and
# calibration, a stand-in MPS control binary that only records its calls. Nothing of a dry run is a GPU
# measurement, and its hosts (emulated) pair by the utilization rule, not by the promoted tree.
set -uo pipefail

cd "$(dirname "$0")/.."
OUT_DIR="${1:-${OUT:-out/gpu_live_check}}"
PY="$(command -v "${PYTHON:-python3}")" || { echo "FAIL python: ${PYTHON:-python3} not found"; exit 1; }
case "$PY" in /*) ;; *) PY="$PWD/$PY" ;; esac  # the jobs run in their own directories
DRY="${LUCID_GPU_CHECK_DRY:-0}"
LIMIT_S="${LUCID_GPU_CHECK_LIMIT_S:-420}"
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
[ "${LUCID_GPU_CHECK_RESUME:-0}" = 1 ] || rm -rf "$OUT_DIR/catalog"  # a check measures afresh
WORK="$(mktemp -d /tmp/lucid-gpu-check.XXXXXX)"
LOG="$OUT_DIR/check.log"
: > "$LOG"
export LUCID_HOME="$WORK/home" PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
URL="sqlite:///$WORK/home/lucid.db"
mkdir -p "$LUCID_HOME"
START=$(date +%s)
FAILED=0

say() { echo "$*" | tee -a "$LOG"; }
check() {  # check NAME CONDITION-RESULT DETAIL
  if [ "$2" = 0 ]; then say "PASS $1: $3"; else say "FAIL $1: $3"; FAILED=1; fi
}
lucid() { "$PY" -m lucid_core.cli "$@" 2>&1 | tee -a "$LOG"; return "${PIPESTATUS[0]}"; }
cleanup() {  # stop what the check started: its runs' process groups and any MPS daemon it left
  for pidfile in "$WORK"/home/*/*/pid "$WORK"/*/*/pid; do
    [ -f "$pidfile" ] && kill -TERM -- "-$(cat "$pidfile")" 2>/dev/null
  done
  for pipe in $(find "$WORK" -type d -name pipe 2>/dev/null); do
    echo quit | CUDA_MPS_PIPE_DIRECTORY="$pipe" timeout 5 nvidia-cuda-mps-control >/dev/null 2>&1
  done
  [ "${KEEP_WORK:-0}" = 1 ] || rm -rf "$WORK"
}
trap cleanup EXIT

if [ "$DRY" = 1 ]; then
  # a stand-in for the driver's MPS control: -d marks a daemon as started, quit removes it, get_server_list answers
  mkdir -p "$WORK/bin"
  cat > "$WORK/bin/nvidia-cuda-mps-control" <<'FAKE'
#!/bin/sh
pipe="${CUDA_MPS_PIPE_DIRECTORY:-/tmp/nvidia-mps}"
log="${CUDA_MPS_LOG_DIRECTORY:-/var/log/nvidia-mps}"
mkdir -p "$pipe" "$log"
# Lucid starts daemons with a clean environment: the calls file is found next to this stand-in then
echo "$(date +%s) $* pipe=$pipe" >> "${LUCID_FAKE_MPS_CALLS:-$(dirname "$0")/../mps-calls.log}"
if [ "${1:-}" = "-d" ]; then : > "$pipe/control"; echo "daemon started (stand-in)" >> "$log/control.log"; exit 0; fi
[ -e "$pipe/control" ] || exit 1
while read -r cmd; do
  case "$cmd" in
    quit) rm -f "$pipe/control"; echo "daemon quit (stand-in)" >> "$log/control.log" ;;
    get_server_list) echo 4242 ;;
  esac
done
FAKE
  chmod +x "$WORK/bin/nvidia-cuda-mps-control"
  export PATH="$WORK/bin:$PATH" LUCID_FAKE_MPS_CALLS="$WORK/mps-calls.log"
  GPU_MODEL="emulated"
  TELEMETRY=emulated
  say "dry run: no GPU; emulated telemetry and calibration, a stand-in MPS control binary"
else
  GPU_MODEL="$(nvidia-smi --query-gpu=name --format=csv,noheader -i 0 2>/dev/null | head -n 1)"
  TELEMETRY=nvml
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,mig.mode.current --format=csv 2>&1 \
    | tee "$OUT_DIR/nvidia-smi.txt" | tee -a "$LOG"
  command -v nvidia-cuda-mps-control >/dev/null 2>&1
  check mps-binary $? "nvidia-cuda-mps-control on PATH"
  [ -n "$GPU_MODEL" ]
  check gpu "$?" "GPU 0 is '${GPU_MODEL:-none}'"
  [ "$FAILED" = 0 ] || exit 1
fi

# 1. calibrate under MPS: two light workloads and their three pairs
CAL=(--host local --gpus 0 --sharing mps --out "$OUT_DIR/catalog" --workdir "$WORK/calibration")
if [ "$DRY" = 1 ]; then  # one workload alone and beside itself: CPU processes on a busy CI machine start slowly
  CAL+=(--workloads neumf:128 --seconds 1 --warmup 0.2 --startup 8 --hold 1.5 --interval 0.2 --threads 1
        --gpu-memory-mb 24576 --emulate)
else
  CAL+=(--workloads neumf:128,pointnet:32 --seconds 8 --warmup 3 --startup 12 --hold 2 --interval 0.5)
fi
timeout --preserve-status --signal=INT "$LIMIT_S" "$PY" -m lucid_core.calibration.cli "${CAL[@]}" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
check calibrate "$rc" "lucid calibrate --sharing mps exited $rc ($(($(date +%s) - START)) s so far)"
[ "$rc" = 0 ] || exit 1

# 2. the packing tree of (this GPU model, mps), promoted into the store the rounds read
THRESHOLDS=()
# dry: the pair ran on CPU cores, whose shared speeds say nothing of a GPU; lower thresholds let it pair
[ "$DRY" = 1 ] && THRESHOLDS=(--tiny 0.5 --medium 0.3)
lucid models train-packing --catalog "$OUT_DIR/catalog" --registry "$LUCID_HOME/models/registry" --promote --store "$URL" \
  "${THRESHOLDS[@]}"
check train-packing "$?" "tree trained on the catalog and promoted for '$GPU_MODEL' shared by mps"

# 3. this machine as a profiling host and an MPS main host; two light jobs that should pair on the main host
lucid hosts add prof0 --store "$URL" --executor local --pool profiling --gpus 1 --gpu-model "$GPU_MODEL" \
  --sharing none --telemetry "$TELEMETRY" --workdir "$WORK/prof0" --python "$PY" >/dev/null
lucid hosts add main0 --store "$URL" --executor local --gpus 1 --gpu-model "$GPU_MODEL" --sharing mps \
  --telemetry "$TELEMETRY" --workdir "$WORK/main0" --python "$PY" >/dev/null
lucid hosts list --store "$URL"
if [ "$DRY" = 1 ]; then
  JOB_A=("$PY" -c 'import time; [time.sleep(0.5) for _ in range(200)]; print("done")')  # outlives B's profiling
  JOB_B=("$PY" -c 'import time; [time.sleep(0.5) for _ in range(90)]; print("done")')
  WORKLOAD=(--workload SynMLP/SynTabular/bs32/amp0)  # a light emulated profile: Tiny by the rule
else
  JOB_A=("$PY" -m lucid_core.calibration.workloads run --workload neumf --batch-size 128 --seconds 60 --warmup 2)
  JOB_B=("$PY" -m lucid_core.calibration.workloads run --workload neumf --batch-size 128 --seconds 45 --warmup 2)
  WORKLOAD=()
fi
SETS=(--set binder.sharing=on --set profiler.tprof_s=15 --set runtime.telemetry_interval_s=1)
A=$("$PY" -m lucid_core.cli submit --store "$URL" --gpus 1 --user check --vc default --name light-a "${WORKLOAD[@]}" \
    -- "${JOB_A[@]}" 2>>"$LOG" | tail -n 1 | awk '{print $NF}')
B=$("$PY" -m lucid_core.cli submit --store "$URL" --gpus 1 --user check --vc default --name light-b "${WORKLOAD[@]}" \
    -- "${JOB_B[@]}" 2>>"$LOG" | tail -n 1 | awk '{print $NF}')
say "submitted $A and $B"
deadline=$(( $(date +%s) + LIMIT_S - ($(date +%s) - START) ))
state() { "$PY" -m lucid_core.cli status "$1" --store "$URL" --json 2>/dev/null \
          | "$PY" -c 'import json, sys; print(json.load(sys.stdin).get("state", "?"))' 2>/dev/null; }
while :; do
  "$PY" -m lucid_core.cli round --store "$URL" "${SETS[@]}" >> "$LOG" 2>&1
  sa=$(state "$A"); sb=$(state "$B")
  case "$sa$sb" in *COMPLETED*COMPLETED*) break ;; esac
  case "$sa $sb" in *FAILED*|*CANCELLED*) break ;; esac
  [ "$(date +%s)" -lt "$deadline" ] || break
  sleep 2
done
check jobs-complete "$([ "$sa" = COMPLETED ] && [ "$sb" = COMPLETED ]; echo $?)" "$A $sa, $B $sb"
"$PY" -m lucid_core.cli explain "$B" --store "$URL" --json > "$OUT_DIR/explain-b.json" 2>>"$LOG"
"$PY" -m lucid_core.cli explain "$A" --store "$URL" --json > "$OUT_DIR/explain-a.json" 2>>"$LOG"
paired=$("$PY" - "$OUT_DIR/explain-a.json" "$OUT_DIR/explain-b.json" "$A" "$B" <<'PYCHECK'
import json, sys
a, b = (json.load(open(path)) for path in sys.argv[1:3])
runs = [r for info in (a, b) for r in info.get("runs", []) if r.get("kind") == "main"]
shared = any(d.get("kind") == "Place" and "shares with" in (d.get("reason") or "") for info in (a, b)
             for d in info.get("decisions", []))
print("yes" if shared and {r.get("host") for r in runs} == {"main0"} else "no")
PYCHECK
)
check paired "$([ "$paired" = yes ]; echo $?)" "the two jobs shared main0's GPU under MPS ($paired)"
if [ "$DRY" = 1 ]; then
  starts=$(grep -c -- ' -d ' "$WORK/mps-calls.log" 2>/dev/null || echo 0)
  check mps-daemon "$([ "$starts" -ge 2 ]; echo $?)" "daemon started $starts time(s) (calibration, then the shared runs)"
fi
"$PY" - "$OUT_DIR/summary.json" <<PYSUM
import json, sys
json.dump({"dry": "$DRY" == "1", "gpu_model": "$GPU_MODEL", "jobs": {"$A": "$sa", "$B": "$sb"},
           "paired": "$paired" == "yes", "seconds": $(($(date +%s) - START)), "passed": $FAILED == 0},
          open(sys.argv[1], "w"), indent=1)
PYSUM
say "$([ "$FAILED" = 0 ] && echo PASSED || echo FAILED) in $(($(date +%s) - START)) s; log: $LOG"
exit "$FAILED"
