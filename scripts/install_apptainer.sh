#!/usr/bin/env bash
# install_apptainer.sh [PREFIX]
# Install a pinned, relocated, NON-setuid Apptainer (Debian sid's package) under PREFIX on a
# Debian 12 bookworm machine, without touching the system's apt sources, lists or libc.
# (bookworm, its backports and trixie carry no apptainer; sid's needs glibc >= 2.38, bookworm has
# 2.36, so the two ELF binaries are patchelf'ed onto a private copy of sid's glibc.)
#
# PREFIX: argument, else $SPOOLRL_CACHE/apptainer, else /var/cache/spoolrl/apptainer.
# Result: PREFIX/usr/bin/apptainer (rollout_node.sandbox.runtimes.find_apptainer() looks there).
# Version: APPTAINER_VERSION (default 1.4.5-2, the version measured in the notes); "any" takes
# whatever sid has.
# If anything cannot be fetched or does not work, the reason goes to
# $SPOOLRL_CACHE/apptainer-unavailable.txt (default /var/cache/spoolrl/...), which the apptainer
# tests print as their skip reason, and the script exits 0: the rest of the suite must still run.
# Needs root (apt-get download), patchelf; at run time squashfs-tools (builds) and uidmap.
# Note: Apptainer works here for unprivileged users only; VM root lacks CAP_SYS_RESOURCE.
set -uo pipefail
CACHE=${SPOOLRL_CACHE:-/var/cache/spoolrl}
PREFIX=$(realpath -m "${1:-$CACHE/apptainer}")
VERSION=${APPTAINER_VERSION:-1.4.5-2}
STATUS="$CACHE/apptainer-unavailable.txt"
mkdir -p "$CACHE"

unavailable() {
  echo "apptainer $VERSION not installed: $*" | tee "$STATUS" >&2
  echo "install_apptainer: the apptainer tests will skip with this reason; everything else is unaffected" >&2
  exit 0
}

debian_mirror() {
  { sed -E 's/\[[^]]*\]//' /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
      awk '$1 == "deb" {print $2}'
    awk '/^URIs:/ {print $2}' /etc/apt/sources.list.d/*.sources 2>/dev/null
  } | grep -v security | head -1
}

install() {
  set -e
  local mirror T pin b
  mirror=${APT_MIRROR:-$(debian_mirror)}
  mirror=${mirror:-http://deb.debian.org/debian}
  T=$(mktemp -d)
  trap 'rm -rf "$T"' RETURN
  mkdir -p "$T/lists/partial" "$T/cache/archives/partial" "$T/dl" "$T/x" "$T/libc"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror sid main" > "$T/sources.list"
  local apt=(-o Dir::Etc::SourceList="$T/sources.list" -o Dir::Etc::SourceParts=/nonexistent
             -o Dir::State::Lists="$T/lists" -o Dir::Cache="$T/cache" -o APT::Sandbox::User=root
             -o DPkg::Lock::Timeout=900 -qq)
  apt-get "${apt[@]}" update
  pin=apptainer; [ "$VERSION" != any ] && pin="apptainer=$VERSION"
  (cd "$T/dl" && apt-get "${apt[@]}" download "$pin" libc6)
  rm -rf "$PREFIX"; mkdir -p "$PREFIX/glibc"
  dpkg-deb -x "$T"/dl/apptainer_*.deb "$T/x"
  dpkg-deb -x "$T"/dl/libc6_*.deb "$T/libc"
  cp -a "$T/x/usr" "$PREFIX/"
  cp -a "$T/libc/usr/lib/x86_64-linux-gnu/." "$PREFIX/glibc/"
  # Apptainer derives etc/ and var/ from its binary's location: the CLI reads PREFIX/usr/etc,
  # the starter PREFIX/usr/lib/{etc,var}.
  cp -a "$T/x/etc" "$PREFIX/usr/etc"
  ln -s ../etc "$PREFIX/usr/lib/etc"
  mkdir -p "$PREFIX/usr/var/lib/apptainer/mnt/session" "$PREFIX/usr/lib/var/lib/apptainer/mnt/session"
  for b in "$PREFIX/usr/bin/apptainer" "$PREFIX/usr/lib/x86_64-linux-gnu/apptainer/bin/starter"; do
    patchelf --set-interpreter "$PREFIX/glibc/ld-linux-x86-64.so.2" \
             --force-rpath --set-rpath "$PREFIX/glibc:/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu" "$b"
  done
  chmod -R a+rX "$PREFIX"
  ls "$T"/dl/apptainer_*.deb | sed 's/.*apptainer_//; s/_.*//' > "$PREFIX/VERSION"
}

[ "$(id -u)" = 0 ] || unavailable "the installer needs root (apt-get download); run it as root"
command -v patchelf >/dev/null || unavailable "patchelf missing (apt-get install -y --no-install-recommends patchelf)"
log=$(mktemp)
if ! (install) >"$log" 2>&1; then
  reason=$(grep -E '^(E:|W:)|rror' "$log" | head -3 | tr '\n' ' ')
  rm -f "$log"
  unavailable "download/unpack from Debian sid failed: ${reason:-no error line captured}"
fi
rm -f "$log"
if ! out=$("$PREFIX/usr/bin/apptainer" --version 2>&1); then
  unavailable "installed binary does not run: $out"
fi
rm -f "$STATUS"
echo "install_apptainer: $out at $PREFIX/usr/bin/apptainer (Debian sid $(cat "$PREFIX/VERSION"))"
