"""Node scratch cleanup: this incarnation's tree at shutdown, and trees left by dead incarnations.

Guarantee: a tree is removed even where the agent took the owner's permissions away (``chmod 000``
directories inside a work dir): every directory is made ``0o700`` top-down before the removal;
symlinks are never followed (their targets may lie outside the tree). Errors are ignored (what
cannot be removed stays for the next cleanup; nothing here may stop the node).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from hpc.fsutil import pid_alive


def remove_tree(root: Path) -> None:
    """Remove ``root`` and everything under it, whatever permissions the agent left on its directories."""
    if root.is_dir() and not root.is_symlink():
        with contextlib.suppress(OSError):
            root.chmod(0o700)
        for dirpath, dirnames, _ in os.walk(root):  # top-down: a directory is opened after its chmod
            for path in (os.path.join(dirpath, name) for name in dirnames):
                if not os.path.islink(path):
                    with contextlib.suppress(OSError):
                        os.chmod(path, 0o700)
    shutil.rmtree(root, ignore_errors=True)


def remove_dead_scratch(scratch: Path, node_id: str) -> list[Path]:
    """Remove ``<scratch>/<node_id>.<pid>.<hex>`` trees whose pid is gone (a killed incarnation); returns them."""
    return _remove_dead({old: old.name.rsplit(".", 2)[-2] for old in scratch.glob(f"{node_id}.*.*")})


def remove_dead_sandbox_scratch(sbx: Path) -> list[Path]:
    """Remove ``<sbx>/sbx-<pid>-<hex>``, the private scratch of sandboxes whose node process is gone (a
    SIGKILLed node never closed them; scripts/soak.py found them left); returns them."""
    return _remove_dead({old: old.name.split("-")[1] for old in sbx.glob("sbx-*-*")})


def _remove_dead(trees: dict[Path, str]) -> list[Path]:
    """Remove each tree whose owner pid (text) is a number of a process that no longer exists."""
    removed = []
    for tree, pid in trees.items():
        if pid.isdigit() and not pid_alive(int(pid)):
            remove_tree(tree)
            removed.append(tree)
    return removed
