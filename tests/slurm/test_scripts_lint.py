"""The shell scripts of this area pass shellcheck and bash -n."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = ["scripts/local_slurm.sh", "scripts/build_sif.sh", "tests/slurm/fake_python.sh"]


@pytest.mark.parametrize("script", SCRIPTS)
def test_shellcheck(script: str) -> None:
    subprocess.run(["bash", "-n", str(REPO / script)], check=True)
    if shutil.which("shellcheck") is None:
        pytest.fail("shellcheck is not installed (apt-get install shellcheck)")
    out = subprocess.run(["shellcheck", str(REPO / script)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


def test_local_slurm_usage_is_explicit() -> None:
    out = subprocess.run(["bash", str(REPO / "scripts/local_slurm.sh")], capture_output=True, text=True)
    assert out.returncode == 2 and "up|down|status" in out.stderr
