"""Atomic file publication that holds on NFS, Lustre and GPFS.

Write to a temporary name in the same directory, fsync, then ``rename`` (atomic within a
directory on every POSIX filesystem); fsync the directory so the new name survives a crash.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Any


def tmp_name(target: Path) -> Path:
    """A unique temporary sibling of ``target``: dot-prefixed so listings skip it."""
    return target.with_name(f".tmp-{target.name}.{os.getpid()}.{secrets.token_hex(4)}")


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
        with open(tmp, "wb") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
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
