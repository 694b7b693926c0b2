"""Node-local scratch under a shared /tmp is ours: a squatted ``spoolrl-<uid>`` (another owner, a
world-writable mode, a symlink) makes opening a real sandbox fail instead of using it."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from hpc.config.sandbox import SandboxConfig
from hpc.errors import SandboxError
from rollout_node.sandbox import open_sandbox
from tests.sandbox.sbx_helpers import need_runtime

pytestmark = pytest.mark.sandbox


def _open(scratch: Path, work: Path) -> None:
    with open_sandbox(SandboxConfig(runtime="bwrap", scratch_dir=str(scratch)), work) as sb:
        assert sb.run("echo ok").output == "ok\n"


def test_a_fresh_scratch_is_created_private(tmp_path: Path) -> None:
    need_runtime("bwrap")
    os.chmod(tmp_path, 0o1777)  # like /tmp
    _open(tmp_path, tmp_path / "w")
    mine = tmp_path / f"spoolrl-{os.getuid()}"
    assert stat.S_IMODE(mine.stat().st_mode) == 0o700 and mine.stat().st_uid == os.getuid()


def test_a_squatted_scratch_is_refused(tmp_path: Path) -> None:
    need_runtime("bwrap")
    squat = tmp_path / f"spoolrl-{os.getuid()}"
    squat.mkdir()
    os.chmod(squat, 0o777)  # world-writable: anyone could have planted the image cache
    with pytest.raises(SandboxError, match="writable by others"):
        _open(tmp_path, tmp_path / "w")
    if os.geteuid() == 0:  # another owner (only root can make one here)
        os.chmod(squat, 0o700)
        os.chown(squat, 65534, 65534)
        with pytest.raises(SandboxError, match="owned by uid 65534"):
            _open(tmp_path, tmp_path / "w")
    squat.rmdir()
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    squat.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(SandboxError, match="not a directory"):
        _open(tmp_path, tmp_path / "w")


def test_a_readable_scratch_of_ours_is_tightened(tmp_path: Path) -> None:
    need_runtime("bwrap")
    mine = tmp_path / f"spoolrl-{os.getuid()}"
    mine.mkdir(mode=0o755)
    os.chmod(mine, 0o755)
    _open(tmp_path, tmp_path / "w")
    assert stat.S_IMODE(mine.stat().st_mode) == 0o700
