"""Fixtures for the sandbox tests (helpers in ``sbx_helpers.py``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable

import pytest

from tests.sandbox.sbx_helpers import HERE, PYTHON, need_image
from tests.unprivileged import CI_USER, CiUser, checkout_traversable


@pytest.fixture(scope="session")
def test_image() -> str:
    return need_image()


@pytest.fixture(scope="session")
def as_user() -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run ``python SCRIPT ARGS`` as the unprivileged CI user (:class:`tests.unprivileged.CiUser`, in its own
    HOME, with the suite's ``SPOOLRL_*`` variables: the image and runtimes to use), or as ourselves when
    the tests already run unprivileged."""
    if os.geteuid() != 0:
        def run_direct(script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
            return subprocess.run([PYTHON, str(HERE / script), *args], capture_output=True, text=True,
                                  timeout=timeout)
        return run_direct  # already unprivileged: run as ourselves
    user = CiUser.in_own_home({k: v for k, v in os.environ.items() if k.startswith("SPOOLRL_")})
    # the venv's interpreter may live under /root (pyenv), the checkout anywhere: the CI user needs to reach them
    changed = checkout_traversable()
    if changed:
        print(f"[sandbox tests] gave o+x to {changed} so {CI_USER} can run {PYTHON}", file=sys.stderr)

    def run(script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return user.run(PYTHON, str(HERE / script), *args, timeout=timeout)
    return run


@pytest.fixture(scope="session")
def as_root() -> Callable[..., subprocess.CompletedProcess[str]]:
    if os.geteuid() != 0:
        pytest.skip("component unavailable: the root variant needs the tests to run as root")

    def run(script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run([PYTHON, str(HERE / script), *args], capture_output=True, text=True,
                              timeout=timeout, cwd="/tmp")
    return run
