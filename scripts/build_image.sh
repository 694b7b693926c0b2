#!/usr/bin/env bash
# build_image.sh [--force] [DEST]
# Build (once) and cache the minimal sandbox test image: a Debian bookworm root filesystem
# DIRECTORY with python3, git, python3-pytest, procps and patch, plus an empty /work (the bind
# target of the episode's work dir; the image is mounted read-only).
#
# No root needed. As root it runs mmdebstrap in root mode; as any other user in unshare mode
# (an unprivileged user namespace with the user's /etc/subuid and /etc/subgid ranges, through
# newuidmap/newgidmap from the uidmap package). Either way the tarball mmdebstrap writes is
# unpacked without device nodes (bwrap and apptainer mount their own /dev); unpacked by a
# non-root user every file belongs to that user.
#
# Where (the paths rollout_node.sandbox.default_image() looks at): DEST, else
# $SPOOLRL_CACHE/images/bookworm-test, else for root /var/cache/spoolrl/images/bookworm-test and
# for any other user ${XDG_CACHE_HOME:-~/.cache}/spoolrl/images/bookworm-test. A non-root user
# with neither DEST nor SPOOLRL_CACHE whose machine already has the system image uses that one
# (nothing is built; --force builds the per-user image). A finished image carries the marker file
# DEST/.spoolrl-image; a second run with the marker present does nothing (use --force).
# The result is world-readable (a+rX) so other users can run sandboxes on it.
# Needs: mmdebstrap and uidmap (scripts/system_packages.sh demo installs them, as root), unprivileged
# user namespaces for non-root, network to the Debian mirror of the machine's apt sources (override
# with APT_MIRROR). ~290 MB; 32 s here on a quiet machine (unshare mode), minutes when the mirror is slow.
set -euo pipefail
FORCE=0
[ "${1:-}" = "--force" ] && { FORCE=1; shift; }
SYSTEM_CACHE=/var/cache/spoolrl
if [ "$(id -u)" = 0 ]; then
  MODE=root; USER_CACHE=$SYSTEM_CACHE
else
  MODE=unshare; USER_CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/spoolrl
fi
if [ -z "${1:-}" ] && [ -z "${SPOOLRL_CACHE:-}" ] && [ "$MODE" = unshare ] && [ "$FORCE" = 0 ] &&
   [ ! -f "$USER_CACHE/images/bookworm-test/.spoolrl-image" ] &&
   [ -f "$SYSTEM_CACHE/images/bookworm-test/.spoolrl-image" ]; then
  echo "build_image: cached system image at $SYSTEM_CACHE/images/bookworm-test" \
       "($(cat "$SYSTEM_CACHE/images/bookworm-test/.spoolrl-image")); --force builds a per-user one"
  exit 0
fi
CACHE=${SPOOLRL_CACHE:-$USER_CACHE}
DEST=$(realpath -m "${1:-$CACHE/images/bookworm-test}")
PACKAGES=python3,git,python3-pytest,procps,patch,ca-certificates

if [ -f "$DEST/.spoolrl-image" ] && [ "$FORCE" = 0 ]; then
  echo "build_image: cached image at $DEST ($(cat "$DEST/.spoolrl-image"))"
  exit 0
fi
command -v mmdebstrap >/dev/null || {
  echo "build_image: mmdebstrap missing; as root: apt-get install -y --no-install-recommends mmdebstrap uidmap" \
       "(scripts/system_packages.sh demo)" >&2; exit 1; }
if [ "$MODE" = unshare ]; then
  command -v newuidmap >/dev/null || {
    echo "build_image: newuidmap missing (building without root needs it); as root: apt-get install -y uidmap" >&2
    exit 1; }
  grep -q "^$(id -un):" /etc/subuid 2>/dev/null || {
    echo "build_image: $(id -un) has no range in /etc/subuid (building without root needs one); as root:" \
         "usermod --add-subuids 100000-165535 --add-subgids 100000-165535 $(id -un)" >&2; exit 1; }
fi

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
mkdir -p "$TMP"
echo "build_image: mmdebstrap ($MODE mode) bookworm from $MIRROR into $TMP"
owner=()
[ "$MODE" = unshare ] && owner=(--no-same-owner)
# device nodes are useless under bwrap/apptainer (both mount their own /dev) and cannot be made without root
mmdebstrap --mode="$MODE" --variant=minbase --include="$PACKAGES" bookworm - "$MIRROR" |
  tar -x -C "$TMP" "${owner[@]}" --exclude='./dev/*'
mkdir -p "$TMP/work"
versions=$(dpkg-query --admindir="$TMP/var/lib/dpkg" -W -f='${Package} ${Version}; ' python3 git)
chmod -R a+rX "$TMP"
echo "bookworm minbase; ${versions}built $(date -u +%FT%TZ) by $(id -un) ($MODE mode)" > "$TMP/.spoolrl-image"
rm -rf "$DEST"
mv "$TMP" "$DEST"
trap - EXIT
echo "build_image: ready: $DEST ($(du -sh "$DEST" | cut -f1))"
