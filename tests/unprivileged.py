"""Running a test's child as the unprivileged CI user (``scripts/test.sh`` creates it, as root).

The venv's interpreter may live under ``/root`` (pyenv), which is ``0700`` on a fresh machine: the CI
user can run it only once every ancestor directory grants others search (x) permission. Each test
that starts a child as that user makes the interpreter traversable itself, so the suite does not
depend on which test ran first.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

CI_USER = os.environ.get("SPOOLRL_CI_USER") or "spoolrl-ci"


def make_traversable(path: Path) -> list[str]:
    """Give others search (x) permission on the ancestors of ``path`` that lack it; the ones changed."""
    changed = []
    for parent in reversed(path.parents):
        mode = parent.stat().st_mode
        if not mode & stat.S_IXOTH:
            parent.chmod(mode | stat.S_IXOTH)
            changed.append(str(parent))
    return changed


def interpreter_traversable() -> list[str]:
    """:func:`make_traversable` for this test run's Python (the file the venv's link resolves to)."""
    return make_traversable(Path(os.path.realpath(sys.executable)))
