"""Fixtures for the sandbox tests (helpers in ``sbx_helpers.py``)."""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from sbx_helpers import HERE, PYTHON, need_image

from tests.unprivileged import CI_USER, make_traversable


@pytest.fixture(scope="session")
def test_image() -> str:
    return need_image()


@pytest.fixture(scope="session")
def as_user() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run ``python SCRIPT ARGS`` as the unprivileged CI user (created if missing; needs root)."""
    if os.geteuid() != 0:
        def run_direct(script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
            return subprocess.run([PYTHON, str(HERE / script), *args], capture_output=True, text=True,
                                  timeout=timeout)
        return run_direct  # already unprivileged: run as ourselves
    try:
        pwd.getpwnam(CI_USER)
    except KeyError:
        subprocess.run(["useradd", "-m", CI_USER], check=True)
    # the venv's interpreter may live under /root (pyenv): the CI user needs to traverse to it
    changed = make_traversable(Path(os.path.realpath(PYTHON)))
    if changed:
        print(f"[sandbox tests] gave o+x to {changed} so {CI_USER} can run {PYTHON}", file=sys.stderr)
    home = pwd.getpwnam(CI_USER).pw_dir
    runuser = shutil.which("runuser") or "/usr/sbin/runuser"

    def run(script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        env = ["env", "-i", f"PATH={os.environ.get('PATH', '/usr/bin:/bin')}", f"HOME={home}", "TMPDIR=/tmp",
               "LANG=C.UTF-8"] + [f"{k}={v}" for k, v in os.environ.items() if k.startswith("SPOOLRL_")
                                  or k == "PYTHONPATH"]  # a worktree's code, not the editable install's
        return subprocess.run([runuser, "-u", CI_USER, "--", *env, PYTHON, str(HERE / script), *args],
                              capture_output=True, text=True, timeout=timeout, cwd="/tmp")
    return run


@pytest.fixture(scope="session")
def as_root() -> Callable[..., subprocess.CompletedProcess[str]]:
    if os.geteuid() != 0:
        pytest.skip("component unavailable: the root variant needs the tests to run as root")

    def run(script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([PYTHON, str(HERE / script), *args], capture_output=True, text=True,
                              timeout=timeout, cwd="/tmp")
    return run
