"""Fixtures for tests against the real local Slurm (``scripts/local_slurm.sh up``).

Jobs are submitted as the unprivileged user ``spoolrl-ci`` (created here if missing, as on a
cluster nobody submits as root); run directories live under the cluster's stand-in shared
filesystem ``$SPOOLRL_SLURM_ROOT/shared`` and their names hold spaces, quotes and a ``%``.
Role commands are replaced by ``fake_python.sh`` (set as each group's ``python``), so these tests
exercise the rendered script itself: groups, placement, signals, failures, requeue.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_helpers import CI_USER, FAKE_PYTHON, SHARED, ci_python_for


@pytest.fixture(scope="session")
def slurm() -> None:
    if shutil.which("sinfo") is None:
        pytest.skip("no Slurm client here: run scripts/local_slurm.sh up (as root)")
    out = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %t"], capture_output=True, text=True, timeout=30)
    nodes = dict(line.split() for line in out.stdout.splitlines() if line.strip())
    if out.returncode != 0 or not {"cpu1", "cpu2", "gpu1", "gpu2"} <= set(nodes):
        pytest.skip(f"local Slurm not up (sinfo: {out.stderr.strip() or out.stdout.strip()}): "
                    "run scripts/local_slurm.sh up")
    if not SHARED.is_dir():
        pytest.skip(f"{SHARED} missing: run scripts/local_slurm.sh up")


@pytest.fixture(scope="session")
def ci_user(slurm: None) -> str:
    if subprocess.run(["id", CI_USER], capture_output=True).returncode != 0:
        if os.geteuid() != 0:
            pytest.skip(f"user {CI_USER} missing and not root to create it")
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", CI_USER], check=True)
    if os.geteuid() != 0:
        pytest.skip("submitting as the unprivileged user needs root (runuser)")
    return CI_USER


@pytest.fixture(scope="session")
def fake_python(ci_user: str) -> Path:
    target = SHARED / "spoolrl-tests" / "fake_python.sh"
    target.parent.mkdir(exist_ok=True)
    os.chmod(target.parent, 0o1777)
    shutil.copy(FAKE_PYTHON, target)
    os.chmod(target, 0o755)
    return target


@pytest.fixture(scope="session")
def ci_python(ci_user: str) -> Path:
    """An interpreter the CI user can run that imports this checkout (see slurm_helpers.ci_python_for)."""
    python, reason = ci_python_for(ci_user)
    if python is None:
        pytest.skip(f"component unavailable: {reason}")
    return python


@pytest.fixture
def run_dir(ci_user: str) -> Iterator[Path]:
    """A fresh, CI-user-writable directory whose name is hard to quote."""
    path = SHARED / "spoolrl-tests" / f"run {uuid.uuid4().hex[:6]} 'it''s' \"q\" 50%"
    path.parent.mkdir(exist_ok=True)
    yield path
    for name in ("spoolrl-test", "spoolrl-test-train", "spoolrl-test-infer", "spoolrl-test-rollout"):
        subprocess.run(["scancel", f"--name={name}", f"--user={CI_USER}", "--quiet"], capture_output=True)
    shutil.rmtree(path, ignore_errors=True)
    path.with_name(f"{path.name}.yaml").unlink(missing_ok=True)  # the CLI test's config sits beside it
