#!/usr/bin/env bash
# The quick start's first command: set up the environment and the sandbox image, then run the demo.
#   scripts/demo.sh [spoolrl demo arguments...]     e.g. scripts/demo.sh --steps 4 --out /tmp/my-demo
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${SPOOLRL_VENV:-$root/.venv}
"$root/scripts/system_packages.sh" demo   # as root: installs what the demo path needs; otherwise names it
"$root/scripts/setup_env.sh" --no-dev
[ -x "$root/scripts/build_image.sh" ] && "$root/scripts/build_image.sh"
exec "$venv/bin/spoolrl" demo "$@"
