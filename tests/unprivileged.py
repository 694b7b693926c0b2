"""Running a test's child as the unprivileged CI user (``scripts/test.sh`` creates it, as root).

The venv's interpreter may live under ``/root`` (pyenv), which is ``0700`` on a fresh machine: the CI
user can run it only once every ancestor directory grants others search (x) permission. Each test
that starts a child as that user makes the interpreter traversable itself, so the suite does not
depend on which test ran first.

:func:`rootless_home` is the quick start's machine state for that user (issue 38): a fresh HOME
whose cache holds the sandbox image ``scripts/build_image.sh`` built as that user, without root.
The suite builds it once (the ``rootless_home`` session fixture of ``tests/conftest.py``): the
rootless image test checks the build, the demo test runs the quick start on it.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CI_USER = os.environ.get("SPOOLRL_CI_USER") or "spoolrl-ci"
REPO = Path(__file__).resolve().parents[1]
IMAGE = Path(".cache") / "spoolrl" / "images" / "bookworm-test"  # under HOME: build_image.sh's per-user image


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


def checkout_traversable() -> list[str]:
    """The interpreter, this checkout (the CI user's PYTHONPATH) and the venv (through its link and where it
    resolves to) made reachable for others, wherever the CI clone was placed (a fresh clone under a 0700
    /root included); the directories changed. Their files are world-readable with root's usual umask 022."""
    targets = [Path(os.path.realpath(sys.executable)), REPO / "hpc", Path(sys.executable),
               Path(os.path.realpath(sys.prefix)) / "lib"]
    return [changed for target in targets for changed in make_traversable(target)]


def ensure_ci_user() -> pwd.struct_passwd:
    """The CI user's passwd entry (created if missing; needs root)."""
    try:
        return pwd.getpwnam(CI_USER)
    except KeyError:
        subprocess.run(["useradd", "-m", CI_USER], check=True)
        return pwd.getpwnam(CI_USER)


@dataclass(frozen=True)
class CiUser:
    """Children run as the CI user (uid, gid and groups of that user only) with a clean environment:
    ``home`` as HOME, this checkout on PYTHONPATH, nothing else of the suite's environment but ``extra_env``."""

    home: Path
    extra_env: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def in_own_home(cls, extra_env: Mapping[str, str] | None = None) -> CiUser:
        """The CI user with the HOME ``useradd -m`` gave it (created if missing; needs root)."""
        return cls(Path(ensure_ci_user().pw_dir), dict(extra_env or {}))

    def popen_kwargs(self) -> dict[str, Any]:
        entry = ensure_ci_user()
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.home), "TMPDIR": "/tmp",
               "LANG": "C.UTF-8", **self.extra_env, "PYTHONPATH": str(REPO)}
        groups = os.getgrouplist(CI_USER, entry.pw_gid)
        return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": groups, "env": env,
                "cwd": str(self.home)}

    def run(self, *argv: str, timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                              **self.popen_kwargs())

    def own(self, path: Path) -> None:
        """Hand ``path`` (recursively) to the CI user."""
        subprocess.run(["chown", "-R", f"{CI_USER}:{CI_USER}", str(path)], check=True)


def run_unprivileged(*argv: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """``argv`` as the CI user in its own HOME when the suite runs as root (root ignores permissions, which
    is what such a test checks), else as this user; either way with :class:`CiUser`'s clean environment."""
    if os.geteuid() != 0:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp"),
               "TMPDIR": "/tmp", "LANG": "C.UTF-8", "PYTHONPATH": str(REPO)}
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout, env=env,
                              stdin=subprocess.DEVNULL)
    checkout_traversable()
    return CiUser.in_own_home().run(*argv, timeout=timeout)


@dataclass(frozen=True)
class RootlessHome:
    """A fresh HOME of the CI user after ``scripts/build_image.sh --force`` ran as that user."""

    user: CiUser
    build: subprocess.CompletedProcess[str]
    build_s: float

    @property
    def image(self) -> Path:
        return self.user.home / IMAGE


def rootless_home() -> Iterator[RootlessHome]:
    """Build the sandbox image as the CI user into a fresh HOME (mmdebstrap's unshare mode: what the quick
    start runs); yields it whether or not the build succeeded (the tests assert on ``build``), then removes it."""
    ensure_ci_user()
    checkout_traversable()
    home = Path(tempfile.mkdtemp(prefix="spoolrl-rootless-", dir="/tmp"))
    user = CiUser(home)
    user.own(home)
    try:
        t0 = time.monotonic()
        build = user.run(str(REPO / "scripts" / "build_image.sh"), "--force", timeout=400)
        yield RootlessHome(user, build, time.monotonic() - t0)
    finally:
        shutil.rmtree(home, ignore_errors=True)
