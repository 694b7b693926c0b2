"""Harness installs shared by the harness tests.

``spoolrl harness install`` is slow (mini-swe-agent: ~60 s here, 82 distributions; Codex CLI from npm ~7 s), so each install is
made once and kept under ``$SPOOLRL_CACHE/harness-test`` (default /var/cache/spoolrl) in a directory
named by a hash of the spec and of the installer's source: a change to the installer makes a fresh one.
``test_install.py`` makes a fresh install every session (the stand-in harness, a local directory).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rollout_node.pipeline import harness_install
from rollout_node.sandbox import bwrap_unavailable_reason

REPO = Path(__file__).resolve().parents[2]
STANDIN_SRC = Path(__file__).with_name("standin")
EXAMPLE_SRC = REPO / "examples" / "harness"
MINI_SPEC = "mini-swe-agent==2.4.6"  # the pinned, unmodified mini-swe-agent from PyPI
CODEX_SPEC = "npm:@openai/codex@0.171.0"  # the pinned, unmodified Codex CLI from npm (its static musl binary)


def spoolrl(*args: str, timeout_s: float = 900.0) -> subprocess.CompletedProcess[str]:
    """The ``spoolrl`` CLI of this worktree, as a user runs it."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "hpc.cli", *args], capture_output=True, text=True, env=env,
                          timeout=timeout_s, stdin=subprocess.DEVNULL)


def _cache_root(tmp_factory: pytest.TempPathFactory) -> Path:
    root = Path(os.environ.get("SPOOLRL_CACHE", "/var/cache/spoolrl")) / "harness-test"
    try:
        root.mkdir(parents=True, exist_ok=True)
        return root
    except OSError:
        return tmp_factory.mktemp("harness-cache")


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:12]


def cached_install(spec: str, name: str, tmp_factory: pytest.TempPathFactory, *extra: str) -> Path:
    """``spoolrl harness install spec`` once per (spec, installer source, ``extra``), under a lock."""
    root = _cache_root(tmp_factory)
    prefix = root / f"{name}-{_digest(spec, Path(harness_install.__file__).read_text(), *extra)}"
    with open(root / f".{prefix.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (prefix / harness_install.MANIFEST).exists():
            done = spoolrl("harness", "install", spec, "--prefix", str(prefix))
            assert done.returncode == 0, done.stdout + done.stderr
    return prefix


def standin_source() -> str:
    return "".join((STANDIN_SRC / p).read_text() for p in ("pyproject.toml", "standin_harness/__init__.py"))


def example_install(tmp_factory: pytest.TempPathFactory) -> Path:
    """The README's example harness (``examples/harness``), installed once per source."""
    source = "".join((EXAMPLE_SRC / p).read_text() for p in ("pyproject.toml", "spoolrl_example_agent/__init__.py"))
    return cached_install(str(EXAMPLE_SRC), "example-agent", tmp_factory, source)


@pytest.fixture(autouse=True)
def _need_sandbox() -> None:
    if why := bwrap_unavailable_reason():
        pytest.skip(why)


@pytest.fixture(scope="session")
def mini_prefix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cached_install(MINI_SPEC, "mini-swe-agent", tmp_path_factory)


@pytest.fixture(scope="session")
def codex_prefix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cached_install(CODEX_SPEC, "codex", tmp_path_factory,
                          Path(harness_install.__file__).with_name("harness_npm.py").read_text())


@pytest.fixture(scope="session")
def standin_prefix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return cached_install(str(STANDIN_SRC), "standin", tmp_path_factory, standin_source())
