#!/usr/bin/env bash
# The quick start's first command: set up the environment and the sandbox image, then run the demo.
#   scripts/demo.sh [spoolrl demo arguments...]     e.g. scripts/demo.sh --steps 4 --out /tmp/my-demo
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=${SPOOLRL_VENV:-$root/.venv}
if [ "$(id -u)" = 0 ] && ! command -v bwrap >/dev/null; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends bubblewrap >/dev/null
fi
"$root/scripts/setup_env.sh" --no-dev
[ -x "$root/scripts/build_image.sh" ] && "$root/scripts/build_image.sh"
exec "$venv/bin/spoolrl" demo "$@"
