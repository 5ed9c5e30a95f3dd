#!/usr/bin/env bash
# On a lent GPU, under 5 minutes: vanilla vs the fast configs of a random-weight LLaDA-8B-shaped model in bf16
# at generation lengths 256 and 512, tokens/s and MFU (how they are estimated: bench/gpu.py's docstring).
#   bench/gpu.sh              on the GPU host; gpu-bench.json lands in $OUT (else a temp folder)
#   bench/gpu.sh --smoke      the same code path on the CPU, a tiny shape
# Python: $PYTHON, else the checkout's .venv, else python3 (with unmask's dependencies installed).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "$PY" bench/gpu.py "$@"
