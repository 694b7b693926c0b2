"""Atomic file publication that holds on NFS, Lustre and GPFS: the one family of atomic writes.

Write to a temporary name in the same directory (created exclusively), fsync, then ``rename``
(atomic within a directory on every POSIX filesystem) or ``link`` (the same, but an existing name
is kept); :func:`atomic_write_bytes` also fsyncs the directory so the new name survives a crash.

Every temporary is named by :func:`tmp_name`: ``.tmp@<pid>@<host>@<tag>``, dot-prefixed so listings
skip it, and carrying its writer's pid and host so a cleaner (:class:`TmpCleaner`) on the
same host can tell that the writer is dead. The tag ends in random hex unless the caller names it,
so a temporary never ends like its target (``*.json`` and ``*.shard`` globs never see one).

The spool's filesystem primitives live here too: :func:`listdir` / :func:`visible` (published names
only), :func:`try_rename` (True also when an NFS retry of this caller's own rename answers ENOENT),
:func:`publish_file` / :func:`publish_new_files` (link, so an existing name is kept), :func:`fs_error`
(a SpoolError naming the directory and the fix) and :func:`pid_alive`.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import secrets
import socket
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import quote

from hpc.errors import SpoolError


def safe_name(text: str) -> str:
    """A file name for ``text``: reversible quoting, never dot-prefixed, hashed when very long."""
    name = quote(text, safe="")
    if name.startswith("."):
        name = "%2E" + name[1:]
    if len(name) > 160:
        name = "h-" + hashlib.sha256(text.encode()).hexdigest()[:40]
    return name


HOST = safe_name(socket.gethostname())
TMP_PREFIX = ".tmp@"


def tmp_name(target: Path, tag: str = "") -> Path:
    """A unique temporary sibling of ``target``: ``.tmp@<pid>@<host>@<tag>`` (default tag:
    ``<target name>.<random hex>``)."""
    return target.with_name(f"{TMP_PREFIX}{os.getpid()}@{HOST}@{tag or f'{target.name}.{secrets.token_hex(4)}'}")


def write_tmp(tmp: Path, data: bytes, *, fsync: bool = True) -> None:
    """Create ``tmp`` (it must not exist) holding ``data``; fsynced unless told otherwise."""
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:  # one write() moves at most ~2 GiB
            view = view[os.write(fd, view):]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:
        pass  # some filesystems (and FUSE mounts) refuse fsync on directories; the rename still happened
    finally:
        os.close(fd)


def atomic_write_bytes(target: Path, data: bytes, *, fsync: bool = True) -> None:
    """Publish ``data`` at ``target`` atomically; on any error nothing is visible at ``target``."""
    tmp = tmp_name(target)
    try:
        write_tmp(tmp, data, fsync=fsync)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    if fsync:
        fsync_dir(target.parent)


def atomic_write_text(target: Path, text: str, *, fsync: bool = True) -> None:
    atomic_write_bytes(target, text.encode(), fsync=fsync)


def atomic_write_json(target: Path, data: Any, *, fsync: bool = True) -> None:
    atomic_write_text(target, json.dumps(data, indent=1, sort_keys=True) + "\n", fsync=fsync)


def read_json(path: Path) -> Any:
    return json.loads(path.read_text())


# ---------------------------------------------------------------------------------------------
# Directories, renames, publication and the temporary cleaner (the spool's filesystem primitives)


class TmpCleaner:
    """Removes temporaries of dead writers: same host and pid gone, or unchanged in size for
    ``max_age_s`` as seen on this process's monotonic clock (other hosts; never their mtimes)."""

    def __init__(self, max_age_s: float) -> None:
        self.max_age_s = max_age_s
        self._seen: dict[Path, tuple[int, float]] = {}

    def clean(self, directory: Path, names: Iterable[str]) -> int:
        removed = 0
        for name in names:
            if name.startswith(TMP_PREFIX) and self._dead(directory / name, name):
                try:
                    (directory / name).unlink(missing_ok=True)
                    removed += 1
                except OSError:
                    pass
                self._seen.pop(directory / name, None)
        return removed

    def _dead(self, path: Path, name: str) -> bool:
        _, pid, host, _rest = (name.split("@", 3) + ["", "", ""])[:4]
        if host == HOST and pid.isdigit() and not pid_alive(int(pid)):
            return True
        try:  # another host, or a pid that is alive (perhaps reused): judge by unchanged size
            size = path.stat().st_size
        except OSError:
            return False
        now = time.monotonic()
        seen = self._seen.get(path)
        if seen is None or seen[0] != size:
            self._seen[path] = (size, now)
            return False
        return now - seen[1] > self.max_age_s


def pid_alive(pid: int) -> bool:
    """Whether a process of this host exists (EPERM: it exists, owned by someone else)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def visible(names: Iterable[str]) -> list[str]:
    """Names that are published (dot-prefixed ones are temporaries)."""
    return [n for n in names if not n.startswith(".")]


def listdir(path: Path) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []


def try_rename(src: Path, dst: Path, *, check_dst: bool = True) -> bool:
    """Rename ``src`` to ``dst``; True if this call moved it (or an earlier retry of it did).

    ``check_dst``: ``dst`` is a name only this caller can produce (its own claim directory, its
    own attempt), so finding it after an error means the rename happened.
    """
    try:
        os.rename(src, dst)
        return True
    except FileNotFoundError:
        return check_dst and dst.exists()  # an NFS retransmit of our own rename answers ENOENT
    except OSError as exc:
        if check_dst and dst.exists():
            return True
        raise SpoolError(f"cannot move {src} to {dst}: {exc}; check permissions and free space on "
                         f"{dst.parent}") from exc


def publish_file(target: Path, data: bytes, *, fsync: bool = True, replace: bool = False) -> bool:
    """Write ``data`` to a temporary sibling, fsync, then make it visible at ``target``.

    ``replace=False`` links instead of renaming so an existing ``target`` is kept (returns False).
    On any error nothing is visible at ``target`` and the temporary is gone.
    """
    tmp = tmp_name(target)
    renamed = False
    try:
        write_tmp(tmp, data, fsync=fsync)
        if replace:
            os.rename(tmp, target)
            renamed = True
            return True
        try:
            os.link(tmp, target)
            return True
        except FileExistsError:
            return False
    except OSError as exc:
        raise fs_error(exc, target.parent, f"publishing {target.name}") from exc
    finally:
        if not renamed:
            tmp.unlink(missing_ok=True)


def publish_new_files(items: Sequence[tuple[Path, bytes]], *, chunk: int = 256) -> int:
    """``publish_file(..., replace=False)`` for many files; returns how many were new.

    The fsyncs of a chunk run concurrently: filesystems commit them together (one journal commit
    on ext4 instead of one per file, 20x faster here), and nothing becomes visible before all the
    data of its chunk is durable.
    """
    added = 0
    for start in range(0, len(items), chunk):
        part = items[start:start + chunk]
        tmps = [tmp_name(target) for target, _ in part]
        try:
            fds = []
            try:
                for tmp, (_, data) in zip(tmps, part, strict=True):
                    fds.append(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
                    os.write(fds[-1], data)
                with ThreadPoolExecutor(min(32, len(fds))) as pool:
                    list(pool.map(os.fsync, fds))
            finally:
                for fd in fds:
                    os.close(fd)
            for tmp, (target, _) in zip(tmps, part, strict=True):
                added += _link_new(tmp, target)
        except OSError as exc:
            raise fs_error(exc, part[0][0].parent, f"publishing {len(part)} files") from exc
        finally:
            for tmp in tmps:
                tmp.unlink(missing_ok=True)
    return added


def _link_new(tmp: Path, target: Path) -> bool:
    try:
        os.link(tmp, target)
        return True
    except FileExistsError:
        return False


def fs_error(exc: OSError, directory: Path, what: str) -> SpoolError:
    """A SpoolError that names the directory and the fix (full disk and quota spelled out)."""
    if exc.errno == errno.ENOSPC:
        return SpoolError(f"{what}: no space left on the filesystem of {directory} (ENOSPC); free space "
                          f"there or move the run directory; nothing partial was published")
    if exc.errno == errno.EDQUOT:
        return SpoolError(f"{what}: disk quota exceeded on {directory} (EDQUOT); free space or ask for a "
                          f"larger quota (see 'lfs quota' / 'quota -s'); nothing partial was published")
    return SpoolError(f"{what}: {exc.strerror or exc} on {directory}; check that it exists and is writable")
