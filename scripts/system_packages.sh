#!/usr/bin/env bash
# The Debian/Ubuntu packages each entry point needs, installed in one place (demo.sh and test.sh call this).
#   scripts/system_packages.sh demo|test      as root: apt-get install what is missing; otherwise name it
#   scripts/system_packages.sh --list demo|test   print the list, one package a line (tests read it)
# The demo path: python3 -m venv (python3-venv), scripts/build_image.sh (mmdebstrap, and uidmap's newuidmap
# for its unprivileged unshare mode; over https: ca-certificates), bwrap sandboxes (bubblewrap), task
# repositories and EVAL diffs (git). Everything else it runs (bash, env, setsid, tar, dpkg-query) is in
# Debian's essential set. Only this step needs root; everything after it runs as any user.
# The test path adds its tools.
set -euo pipefail
DEMO_PACKAGES=(bubblewrap mmdebstrap uidmap git ca-certificates python3-venv)
TEST_PACKAGES=("${DEMO_PACKAGES[@]}" shellcheck bindfs strace tmux patch procps psmisc patchelf
               squashfs-tools build-essential chromium)

list=0
[ "${1:-}" = "--list" ] && { list=1; shift; }
case "${1:-}" in
  demo) packages=("${DEMO_PACKAGES[@]}") ;;
  test) packages=("${TEST_PACKAGES[@]}") ;;
  *) echo "usage: $0 [--list] demo|test" >&2; exit 2 ;;
esac
if [ "$list" = 1 ]; then printf '%s\n' "${packages[@]}"; exit 0; fi

if ! command -v dpkg >/dev/null; then
  echo "system_packages: not a Debian/Ubuntu system; install the equivalents of: ${packages[*]}" >&2
  exit 0
fi
missing=()
for p in "${packages[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "system_packages: the $1 path needs these packages, which are not installed: ${missing[*]}" >&2
  echo "  install them as root:  sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
  echo "  (continuing: what needs them fails with its own message)" >&2
  exit 0
fi
echo "system_packages: apt-get install ${missing[*]}" >&2
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
