"""The quick start without root (issue 38 item 2): ``scripts/build_image.sh`` run by the unprivileged CI user
builds the sandbox image (mmdebstrap's unshare mode) into that user's cache, ``default_image()`` finds it, and a
real bwrap sandbox runs on it as that user (``spoolrl sandbox exec``).

It really downloads and unpacks Debian bookworm (~35 s here): the build is what the quick start runs. It is
built once per session (the ``rootless_home`` fixture); the demo test (tests/e2e/test_demo.py) runs the quick
start on the same image as the same user.
"""

from __future__ import annotations

import json
import sys

import pytest

from tests.unprivileged import CI_USER, REPO, RootlessHome, ensure_ci_user

pytestmark = [pytest.mark.sandbox]
PYTHON = sys.executable  # the venv (made traversable by the fixture)


def test_unprivileged_user_builds_the_image_and_runs_a_sandbox_on_it(rootless_home: RootlessHome) -> None:
    uid = ensure_ci_user().pw_uid
    build, image, user = rootless_home.build, rootless_home.image, rootless_home.user
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-3000:]
    assert f"build_image: ready: {image}" in build.stdout, build.stdout
    assert "(unshare mode)" in build.stdout
    marker = (image / ".spoolrl-image").read_text()
    assert f"by {CI_USER} (unshare mode)" in marker and "python3 3.11" in marker, marker
    # unpacked by the user: no root-owned file, no device node
    assert (image / "usr" / "bin" / "python3").stat().st_uid == uid
    assert (image / "etc" / "passwd").stat().st_uid == uid
    assert not any((image / "dev").iterdir())
    print(f"rootless image build: {rootless_home.build_s:.1f} s")

    again = user.run(str(REPO / "scripts" / "build_image.sh"), timeout=60)
    assert again.returncode == 0 and f"cached image at {image}" in again.stdout, again.stdout + again.stderr

    work = user.home / "work"
    work.mkdir()
    user.own(work)
    probe = user.run(PYTHON, "-m", "hpc.cli", "sandbox", "exec", "--runtime", "bwrap", "--workdir", str(work),
                     "--", "cat /.spoolrl-image && python3 -c 'print(6 * 7)' > /work/out && id -u", timeout=120)
    assert probe.returncode == 0, probe.stdout + probe.stderr
    assert marker.strip() in probe.stdout, probe.stdout  # default_image() chose the per-user image
    assert json.loads(probe.stdout)["output"].splitlines()[-1] == str(uid)  # the sandbox ran as that user
    assert (work / "out").read_text().strip() == "42"
