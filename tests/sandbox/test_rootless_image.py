"""The quick start without root (issue 38 item 2): ``scripts/build_image.sh`` run by the unprivileged CI user
builds the sandbox image (mmdebstrap's unshare mode) into that user's cache, ``default_image()`` finds it, and a
real bwrap sandbox runs on it as that user (``spoolrl sandbox exec``).

It really downloads and unpacks Debian bookworm (~35 s here): the build is what the quick start runs.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.unprivileged import CI_USER, interpreter_traversable

pytestmark = [pytest.mark.sandbox]
REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable  # the venv (its interpreter made traversable by the fixture)


@pytest.fixture
def ci_home() -> Iterator[Path]:
    """A fresh HOME for the CI user (so ~/.cache/spoolrl is empty), removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("component unavailable: running a child as the CI user needs the tests to run as root")
    try:
        pwd.getpwnam(CI_USER)
    except KeyError:
        subprocess.run(["useradd", "-m", CI_USER], check=True)
    interpreter_traversable()
    home = Path(tempfile.mkdtemp(prefix="spoolrl-rootless-", dir="/tmp"))
    shutil.chown(home, CI_USER, CI_USER)
    yield home
    shutil.rmtree(home, ignore_errors=True)


def as_ci(home: Path, *argv: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = ["env", "-i", f"PATH={os.environ.get('PATH', '/usr/bin:/bin')}", f"HOME={home}", "TMPDIR=/tmp",
           "LANG=C.UTF-8", f"PYTHONPATH={REPO}"]
    runuser = shutil.which("runuser") or "/usr/sbin/runuser"
    return subprocess.run([runuser, "-u", CI_USER, "--", *env, *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=home)


def test_unprivileged_user_builds_the_image_and_runs_a_sandbox_on_it(ci_home: Path) -> None:
    uid = pwd.getpwnam(CI_USER).pw_uid
    t0 = time.monotonic()
    build = as_ci(ci_home, str(REPO / "scripts" / "build_image.sh"), "--force", timeout=400)
    build_s = time.monotonic() - t0
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-3000:]
    image = ci_home / ".cache" / "spoolrl" / "images" / "bookworm-test"
    assert f"build_image: ready: {image}" in build.stdout, build.stdout
    assert "(unshare mode)" in build.stdout
    marker = (image / ".spoolrl-image").read_text()
    assert f"by {CI_USER} (unshare mode)" in marker and "python3 3.11" in marker, marker
    # unpacked by the user: no root-owned file, no device node
    assert (image / "usr" / "bin" / "python3").stat().st_uid == uid
    assert (image / "etc" / "passwd").stat().st_uid == uid
    assert not any((image / "dev").iterdir())
    print(f"rootless image build: {build_s:.1f} s")

    again = as_ci(ci_home, str(REPO / "scripts" / "build_image.sh"), timeout=60)
    assert again.returncode == 0 and f"cached image at {image}" in again.stdout, again.stdout + again.stderr

    work = ci_home / "work"
    work.mkdir()
    shutil.chown(work, CI_USER, CI_USER)
    probe = as_ci(ci_home, PYTHON, "-m", "hpc.cli", "sandbox", "exec", "--runtime", "bwrap", "--workdir", str(work),
                  "--", "cat /.spoolrl-image && python3 -c 'print(6 * 7)' > /work/out && id -u", timeout=120)
    assert probe.returncode == 0, probe.stdout + probe.stderr
    assert marker.strip() in probe.stdout, probe.stdout  # default_image() chose the per-user image
    assert (work / "out").read_text().strip() == "42"
