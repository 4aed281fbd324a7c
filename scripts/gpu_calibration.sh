#!/usr/bin/env bash
# Short calibration on a real NVIDIA GPU (about 8-9 minutes): four workloads, 20 s windows, every pair.
#
# Writes OUT/catalog/{single_data.csv, colocate_info.csv, measurements.jsonl, environment.json,
# comparison.md} and OUT/nvidia-smi.txt, OUT/calibration.log. The catalog is rewritten after every
# run. At LUCID_CALIB_LIMIT_S the kit gets SIGINT: it stops its runs on the GPU (and the MPS daemon),
# keeps what was measured, prints "stopped by SIGINT (a time limit or Ctrl-C): measured N of M runs; ..." and exits 3
# (rerunning the script resumes it). LUCID_CALIB_SHARING=mps measures under the MPS control daemon,
# which the kit starts and quits itself; environment.json records the sharing and the GPU model.
#
# Usage:  bash scripts/gpu_calibration.sh [OUT]          (OUT defaults to $OUT, else out/gpu_calibration)
# Needs:  python3 with torch (CUDA build) and pynvml (nvidia-ml-py); lucid_core is run from this checkout.
# Labels are compared with a reference single_data.csv when one is found at $LUCID_CALIB_REFERENCE,
# .calib-ref/single_data.csv or $LUCID_SHARED_DATA/lucid_artifact/single_data.csv (the RTX 3090 labels).
#
# On the lent device machine (the session copies the reference in first, since ../shared does not travel):
#   mkdir -p .calib-ref && cp ../shared/data/lucid_artifact/single_data.csv .calib-ref/
#   grep -qx '/.calib-ref/' .git/info/exclude || echo '/.calib-ref/' >> .git/info/exclude
#   run(command="bash scripts/gpu_calibration.sh", carry=[".calib-ref"], timeout_s=600)
# then copy the returned catalog into benchmarks/results/gpu_calibration/ and commit it.
#
# LUCID_CALIB_DRY=1 rehearses the script on a machine without a GPU: 1 s windows on the CPU,
# emulated telemetry, nothing about it is a GPU measurement.
set -uo pipefail

cd "$(dirname "$0")/.."
OUT_DIR="${1:-${OUT:-out/gpu_calibration}}"
PY="${PYTHON:-python3}"
WORKLOADS="${LUCID_CALIB_WORKLOADS:-resnet18:128,lstm:64,pointnet:32,neumf:128}"
SECONDS_EACH="${LUCID_CALIB_SECONDS:-20}"
LIMIT_S="${LUCID_CALIB_LIMIT_S:-540}"   # stop measuring before a 600 s device command limit
SHARING="${LUCID_CALIB_SHARING:-time-slice}"   # time-slice | mps
mkdir -p "$OUT_DIR/catalog"
LOG="$OUT_DIR/calibration.log"
export PYTHONUNBUFFERED=1

REF=""
for candidate in "${LUCID_CALIB_REFERENCE:-}" .calib-ref/single_data.csv \
                 "${LUCID_SHARED_DATA:-../shared/data}/lucid_artifact/single_data.csv"; do
  if [ -n "$candidate" ] && [ -f "$candidate" ]; then REF="$candidate"; break; fi
done

{
  echo "start $(date -u +%FT%TZ) workloads=$WORKLOADS seconds=$SECONDS_EACH sharing=$SHARING dry=${LUCID_CALIB_DRY:-0} reference=${REF:-none}"
  nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv 2>&1 | tee "$OUT_DIR/nvidia-smi.txt"
  "$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())'
} 2>&1 | tee "$LOG"

ARGS=(--host local --gpus 0 --workloads "$WORKLOADS" --seconds "$SECONDS_EACH" --warmup 3 --startup 10
      --hold 2 --interval 0.5 --sharing "$SHARING" --out "$OUT_DIR/catalog" --workdir /tmp/lucid-calibration-runs)
if [ "${LUCID_CALIB_DRY:-0}" = 1 ]; then
  ARGS=(--host local --gpus 0 --workloads "$WORKLOADS" --seconds 1 --warmup 0.2 --startup 8 --hold 0.2
        --interval 0.2 --threads 1 --emulate "${REF:-artifact}" --gpu-memory-mb 24576 --sharing "$SHARING"
        --out "$OUT_DIR/catalog" --workdir /tmp/lucid-calibration-dry-runs)
fi
[ -n "$REF" ] && ARGS+=(--compare-with "$REF")

# --preserve-status: the kit's own exit status (3 when stopped at the limit), not timeout's 124;
# --kill-after: should its clean-up (stopping runs, quitting MPS) hang, it is killed 30 s later
timeout --preserve-status --kill-after=30 --signal=INT "$LIMIT_S" \
  "$PY" -m lucid_core.calibration.cli "${ARGS[@]}" 2>&1 | tee -a "$LOG"
rc=${PIPESTATUS[0]}
echo "calibrate exited $rc at $(date -u +%FT%TZ)$([ "$rc" = 3 ] && echo ' (stopped at the time limit)')" \
  | tee -a "$LOG"
if [ "$rc" -ne 0 ] && [ -n "$REF" ] && [ -f "$OUT_DIR/catalog/single_data.csv" ]; then
  # stopped early: still compare what was measured
  "$PY" -m lucid_core.calibration.compare --catalog "$OUT_DIR/catalog" --reference "$REF" \
    --out "$OUT_DIR/catalog/comparison.md" 2>&1 | tee -a "$LOG"
fi
ls -la "$OUT_DIR" "$OUT_DIR/catalog" | tee -a "$LOG"
exit "$rc"
