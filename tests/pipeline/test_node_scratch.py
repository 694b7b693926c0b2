"""Issue 14 item 9 (leftover): ``spoolrl rollout-node`` creates its node scratch with
``hpc.paths.private_dir``: a planted, world-writable ``spoolrl-rollout-<uid>`` makes the real node
process exit 2 naming it, before anything is claimed; a fresh one is made 0700."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from hpc.cli.run import init_run
from hpc.config import load_config

REPO = Path(__file__).resolve().parents[2]


def _node(run: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hpc.cli", "rollout-node", str(run), "--once"], cwd=REPO,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)


def test_planted_rollout_scratch_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared-tmp"
    planted = shared / f"spoolrl-rollout-{os.getuid()}"
    planted.mkdir(parents=True)
    planted.chmod(0o777)  # what a co-tenant who got there first leaves
    run = tmp_path / "run"
    init_run(str(run), load_config(None, [f"sandbox.scratch_dir={shared}", "rollout.policy=scripted"]))
    out = _node(run)
    assert out.returncode == 2, out.stderr[-2000:]
    assert str(planted) in out.stderr and "writable" in out.stderr, out.stderr[-2000:]
    assert not list((run / "spool").rglob("claimed/*/*")), "nothing may be claimed"

    planted.rmdir()
    out = _node(run)  # no tasks: --once exits 0 at once, with the scratch made private
    assert out.returncode == 0, out.stderr[-2000:]
    assert stat.S_IMODE(planted.stat().st_mode) == 0o700 and planted.stat().st_uid == os.getuid()
