"""Atomic file publication that holds on NFS, Lustre and GPFS: the one family of atomic writes.

Write to a temporary name in the same directory (created exclusively), fsync, then ``rename``
(atomic within a directory on every POSIX filesystem) or ``link`` (the same, but an existing name
is kept); :func:`atomic_write_bytes` also fsyncs the directory so the new name survives a crash.

Every temporary is named by :func:`tmp_name`: ``.tmp@<pid>@<host>@<tag>``, dot-prefixed so listings
skip it, and carrying its writer's pid and host so a cleaner (:class:`hpc.lease.TmpCleaner`) on the
same host can tell that the writer is dead. The tag ends in random hex unless the caller names it,
so a temporary never ends like its target (``*.json`` and ``*.shard`` globs never see one).
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import socket
from pathlib import Path
from typing import Any
from urllib.parse import quote


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
