#!/usr/bin/env bash
# The sort capacity pilot on a lent GPU host, in one call of the device tool (about 8 minutes):
#   run(command="bash docs/experiments/sort-diffusion/device_capacity.sh", timeout_s=560)
# Three sort-only models from step 0 train side by side on the one GPU (batches 8x the CPU pilot's),
# each stopped by `timeout` if its steps run long (its last 500-step checkpoint is then scored),
# then each is scored on 200 validation `sort` items at the 128 canvas, vanilla decoding (per length band in the log).
# Logs and score rows land in $OUT. The host's python3 holds torch with CUDA, tokenizers,
# safetensors, rich, numpy and yaml: all that these imports need.
# A smoke run of the whole script on the CPU (20 steps each, 4 items):
#   DEVICE=cpu SMOKE=1 OUT=/tmp/capacity-out PYTHON=.venv/bin/python bash docs/experiments/sort-diffusion/device_capacity.sh
set -uo pipefail
DEVICE=${DEVICE:-cuda} PYTHON=${PYTHON:-python3} N=200 SCALE=8
OUT=${OUT:-.unmask/experiments/device}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,memory.total --format=csv > "$OUT/gpu.txt" 2>&1
$PYTHON -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" | tee -a "$OUT/gpu.txt"
WORK=/tmp/capacity
[ "${SMOKE:-0}" = 1 ] && { N=4; SCALE=1; WORK=/tmp/capacity-smoke; }
rm -rf "$WORK"
# name layers d_model steps
RUNS="L4-d128 4 128 6000
L8-d128 8 128 6000
L8-d256 8 256 4000"
while read -r name layers d steps; do
  [ "${SMOKE:-0}" = 1 ] && steps=20
  timeout 330 $PYTHON docs/experiments/sort-diffusion/scratch_train.py "$WORK/$name" "$steps" "$layers" "$d" \
      --device "$DEVICE" --batch-scale $SCALE --threads 2 > "$OUT/train-$name.log" 2>&1 &
done <<< "$RUNS"
wait
while read -r name _; do
  model="$WORK/$name/out"; [ -f "$model/config.json" ] || model="$WORK/$name/state/last"
  tail -n 1 "$OUT/train-$name.log"
  timeout 90 $PYTHON -m evals.model_report "$model" --device "$DEVICE" --split validation --n $N --tasks sort --ratios 1 \
      --out "$OUT/sort128-$name.json" > "$OUT/eval-$name.log" 2>&1 &
done <<< "$RUNS"
wait
for f in "$OUT"/eval-*.log; do echo "== $f"; tail -n 12 "$f"; done
