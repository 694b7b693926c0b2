#!/usr/bin/env bash
# Create or update the project's virtual environment (default ./.venv) with spoolrl + train + dev extras.
# Idempotent: it reinstalls only when pyproject.toml or the constraints changed.
# Usage: scripts/setup_env.sh [--no-dev]     env: SPOOLRL_VENV (path), PYTHON (interpreter, default python3)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${SPOOLRL_VENV:-$root/.venv}
python=${PYTHON:-python3}
extras="train,dev"
[ "${1:-}" = "--no-dev" ] && extras="train"
stamp_want=$(cat "$root/pyproject.toml" "$root/scripts/constraints-cpu.txt" | sha256sum | cut -c1-16)-$extras
if [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.spoolrl-stamp" 2>/dev/null)" = "$stamp_want" ]; then
  exit 0
fi
echo "setup_env: installing spoolrl[$extras] into $venv (about 1 minute on a fresh machine)" >&2
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
# torch is named in the same command as everything else so that the CPU pin always holds.
log=$(mktemp)
if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check \
    -c "$root/scripts/constraints-cpu.txt" "torch==2.13.0" -e "${root}[${extras}]" >"$log" 2>&1; then
  grep -v "is ignored: it is neither a file nor a directory" "$log" >&2
  echo "setup_env: pip failed (log above); nothing was marked as installed" >&2
  exit 1
fi
rm -f "$log"
# DeepSpeed ships as an sdist without compiled ops; its first use on CPU JIT-builds the shm_comm op
# per user (30-200 s), and a job cancelled during that build leaves a lock that hangs the next one.
# Build it once into the venv instead (the same source, ahead of time).
if ! ls "$venv"/lib/python3*/site-packages/deepspeed/ops/comm/deepspeed_shm_comm_op*.so >/dev/null 2>&1; then
  ds_version=$("$venv/bin/python" -c "import importlib.metadata as m; print(m.version('deepspeed'))")
  echo "setup_env: building DeepSpeed's shm_comm op ahead of time (1-3 minutes, once)" >&2
  if ! DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=1 "$venv/bin/python" -m pip install -q --disable-pip-version-check \
      --no-cache-dir --no-build-isolation --no-deps --force-reinstall "deepspeed==$ds_version" >"$log" 2>&1; then
    grep -v "is ignored: it is neither a file nor a directory" "$log" >&2
    echo "setup_env: the ahead-of-time DeepSpeed op build failed (log above); DeepSpeed will JIT-build it" >&2
  fi
  rm -f "$log"
fi
"$venv/bin/python" -c "import torch, deepspeed, transformers, hpc; print('setup_env: torch', torch.__version__)" >&2
echo "$stamp_want" > "$venv/.spoolrl-stamp"
