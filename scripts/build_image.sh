#!/usr/bin/env bash
# build_image.sh [--force] [DEST]
# Build (once) and cache the minimal sandbox test image: a Debian bookworm root filesystem
# DIRECTORY with python3, git, python3-pytest, procps and patch, plus an empty /work (the bind
# target of the episode's work dir; the image is mounted read-only).
#
# Where: DEST, else $SPOOLRL_CACHE/images/bookworm-test, else /var/cache/spoolrl/images/bookworm-test
# (the path rollout_node.sandbox.default_image() looks at). A finished image carries the marker
# file DEST/.spoolrl-image; a second run with the marker present does nothing (use --force).
# The result is world-readable (a+rX) so unprivileged users can run sandboxes on it (bwrap binds
# it read-only; apptainer execs it as a sandbox directory).
# Needs: root (debootstrap), network to the Debian mirror of the machine's apt sources
# (override with APT_MIRROR). Takes ~45-60 s here; ~200 MB.
set -euo pipefail
FORCE=0
[ "${1:-}" = "--force" ] && { FORCE=1; shift; }
CACHE=${SPOOLRL_CACHE:-/var/cache/spoolrl}
DEST=$(realpath -m "${1:-$CACHE/images/bookworm-test}")
PACKAGES=python3,git,python3-pytest,procps,patch,ca-certificates

if [ -f "$DEST/.spoolrl-image" ] && [ "$FORCE" = 0 ]; then
  echo "build_image: cached image at $DEST ($(cat "$DEST/.spoolrl-image"))"
  exit 0
fi
[ "$(id -u)" = 0 ] || { echo "build_image: needs root (debootstrap); on clusters build a SIF with apptainer build --fakeroot instead" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "build_image: debootstrap missing: apt-get install -y --no-install-recommends debootstrap" >&2; exit 1; }

mirror() {  # first non-security Debian archive of the machine's apt sources
  { sed -E 's/\[[^]]*\]//' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
      awk '$1 == "deb" {print $2}'
    awk '/^URIs:/ {print $2}' /etc/apt/sources.list.d/*.sources 2>/dev/null
  } | grep -v security | head -1
}
MIRROR=${APT_MIRROR:-$(mirror)}
MIRROR=${MIRROR:-http://deb.debian.org/debian}

TMP="$DEST.tmp.$$"
trap 'rm -rf "$TMP"' EXIT
mkdir -p "$(dirname "$DEST")"
echo "build_image: debootstrap bookworm from $MIRROR into $TMP"
debootstrap --variant=minbase --include="$PACKAGES" bookworm "$TMP" "$MIRROR"
chroot "$TMP" apt-get clean
rm -rf "$TMP"/var/lib/apt/lists/* "$TMP"/var/cache/apt/*.bin
mkdir -p "$TMP/work"
python=$(chroot "$TMP" python3 --version)
git=$(chroot "$TMP" git --version)
# device nodes are useless under bwrap/apptainer (both mount their own /dev) and break rootless copies
find "$TMP/dev" -mindepth 1 -delete
chmod -R a+rX "$TMP"
echo "bookworm minbase; $python; $git; built $(date -u +%FT%TZ)" > "$TMP/.spoolrl-image"
rm -rf "$DEST"
mv "$TMP" "$DEST"
trap - EXIT
echo "build_image: ready: $DEST ($(du -sh "$DEST" | cut -f1))"
