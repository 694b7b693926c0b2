#!/usr/bin/env bash
# GPU check of the trainer: bf16 ZeRO-2 and ZeRO-3 steps with NCCL on one GPU, resume equality,
# HF export, generation-vs-trainer logprobs, peak memory and tokens/s (details: scripts/gpu_check.py).
#
# On a lent GPU machine (Python 3.12, torch 2.11, no DeepSpeed, no network), from the repo root,
# with the wheels in .whl/ carried along (DeepSpeed 0.19.8 built here as a py3-none-any wheel, plus
# hjson, pydantic, pydantic-core, annotated-types, typing-inspection for cp312):
#     scripts/gpu_check.sh                 # results in $OUT/gpu_check.json (OUT defaults to ./gpu_check_out)
# Here, without a GPU (dry run of the same code on a tiny model, gloo, fp32):
#     PYTHON=.venv/bin/python scripts/gpu_check.sh --cpu
# Budget: about 8 minutes at most (the python part is killed after 450 s).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${OUT:-$PWD/gpu_check_out}
mkdir -p "$OUT"
if ! "$PY" -c "import deepspeed" 2>/dev/null; then
  if ! ls .whl/*.whl >/dev/null 2>&1; then
    echo "gpu_check: DeepSpeed is not importable and no wheels are in .whl/ (see the header of this script)" >&2
    exit 2
  fi
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
if command -v nvidia-smi >/dev/null; then nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; fi
timeout 450 "$PY" scripts/gpu_check.py --out "$OUT" "$@" 2>&1 | tee "$OUT/gpu_check.log" | grep -v -E "Loading weights|Writing model" || exit "${PIPESTATUS[0]}"
