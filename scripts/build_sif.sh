#!/bin/bash
# Build one of spoolrl's Apptainer images without root (apptainer build --fakeroot).
#
#   scripts/build_sif.sh task-base    [OUT_DIR]   -> OUT_DIR/task-base.sif
#   scripts/build_sif.sh rollout-node [OUT_DIR]   -> OUT_DIR/rollout-node.sif
#   scripts/build_sif.sh from-rootfs DIR [OUT_DIR] -> OUT_DIR/<name of DIR>.sif  (no network: packs a
#                                                    root filesystem directory, e.g. scripts/build_image.sh's)
#
# OUT_DIR defaults to ./sif (put it on the shared filesystem: every node reads the SIF, and the
# sandbox image cache stages it to node-local disk). What each image guarantees: sif_builds/README.md.
# Needs: apptainer (or singularity) >= 1.1 on PATH (or APPTAINER=/path/to/apptainer), a fakeroot
# mapping for this user in /etc/subuid + /etc/subgid (ask the admins; `apptainer build --fakeroot`
# says so if it is missing), network to Docker Hub and Debian for the two docker-based images.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/.." && pwd)
APPTAINER=${APPTAINER:-$(command -v apptainer || command -v singularity || true)}

die() { echo "build_sif: $*" >&2; exit 1; }
usage() { sed -n '2,8p' "$0" >&2; exit 2; }

[ $# -ge 1 ] || usage
[ -n "$APPTAINER" ] || die "apptainer not found (install it, or set APPTAINER=/path/to/apptainer)"

build() {  # build DEF_OR_DIR OUT
  local src=$1 out=$2 tmp
  mkdir -p "$(dirname "$out")"
  tmp="$out.tmp.$$"
  # --fakeroot: root inside the build only (user namespace); nothing here needs real root.
  if ! "$APPTAINER" build --fakeroot --force "$tmp" "$src"; then
    rm -f "$tmp"
    die "build of $src failed (no fakeroot mapping? check /etc/subuid for $(id -un))"
  fi
  mv -f "$tmp" "$out"  # readers on other nodes never see a half-written SIF
  echo "$out"
}

stage_source() {  # the rollout-node image installs this checkout: tracked files of HEAD plus edits
  mkdir -p "$REPO/build/sif-stage"
  if git -C "$REPO" rev-parse --git-dir >/dev/null 2>&1; then
    git -C "$REPO" ls-files -z --cached --others --exclude-standard |
      tar -C "$REPO" --null -T - -cf "$REPO/build/sif-stage/spoolrl-src.tar"
  else
    tar -C "$REPO" --exclude=./.venv --exclude=./build --exclude=./.git -cf "$REPO/build/sif-stage/spoolrl-src.tar" .
  fi
}

case "$1" in
  task-base)
    build "$REPO/sif_builds/task-base.def" "$(realpath -m "${2:-sif}")/task-base.sif" ;;
  rollout-node)
    out="$(realpath -m "${2:-sif}")/rollout-node.sif"
    stage_source
    # %files paths are relative to the working directory of the build.
    (cd "$REPO" && build sif_builds/rollout-node.def "$out") ;;
  from-rootfs)
    if [ $# -lt 2 ] || [ ! -d "$2" ]; then die "from-rootfs needs a root filesystem directory"; fi
    build "$(realpath "$2")" "$(realpath -m "${3:-sif}")/$(basename "$(realpath "$2")").sif" ;;
  *) usage ;;
esac
