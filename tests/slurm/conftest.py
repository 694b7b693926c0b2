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
import site
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from slurm_helpers import CI_USER, FAKE_PYTHON, SHARED, as_ci_user


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
    """An interpreter the CI user can run that imports this checkout and its venv's packages.

    The dev venv's interpreter may live in root's (mode 700) home, so a venv is made from the
    system python3 with a .pth that adds this venv's site-packages."""
    base = Path("/usr/bin/python3")
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    probe = subprocess.run([str(base), "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                           capture_output=True, text=True)
    if probe.returncode != 0 or probe.stdout.strip() != version:
        pytest.skip(f"component unavailable: no /usr/bin/python3 {version} to build the CI user's venv")
    venv = SHARED / "spoolrl-tests" / f"venv-{version}"
    if not (venv / "bin" / "python").exists():
        subprocess.run([str(base), "-m", "venv", "--without-pip", str(venv)], check=True)
    pth = venv / "lib" / f"python{version}" / "site-packages" / "spoolrl-dev.pth"
    dirs = [d for d in site.getsitepackages() if Path(d).is_dir()]
    pth.write_text("".join(f"import site; site.addsitedir({d!r})\n" for d in dirs))
    check = as_ci_user([str(venv / "bin" / "python"), "-c", "import hpc.cli, submitit, yaml"])
    if check.returncode != 0:
        pytest.skip(f"component unavailable: {CI_USER} cannot import this checkout ({check.stderr.strip()[-200:]});"
                    " put the repository and its venv where that user can read them")
    return venv / "bin" / "python"


@pytest.fixture
def run_dir(ci_user: str) -> Iterator[Path]:
    """A fresh, CI-user-writable directory whose name is hard to quote."""
    path = SHARED / "spoolrl-tests" / f"run {uuid.uuid4().hex[:6]} 'it''s' \"q\" 50%"
    path.parent.mkdir(exist_ok=True)
    yield path
    for name in ("spoolrl-test", "spoolrl-test-train", "spoolrl-test-infer", "spoolrl-test-rollout"):
        subprocess.run(["scancel", f"--name={name}", f"--user={CI_USER}", "--quiet"], capture_output=True)
    shutil.rmtree(path, ignore_errors=True)
