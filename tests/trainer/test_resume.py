"""Exact resume with 1 and 2 processes (SIGKILL right after a checkpoint), and 2 -> 1 ranks (universal checkpoint).

``resume_driver.py`` (its own process) runs the trainer ranks as forked children on run directories
whose spools hold the same known trajectories; see its docstring.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.deepspeed, pytest.mark.timeout(600)]


@pytest.mark.parametrize(("nproc", "stage"), [(1, 0), (2, 2)])
def test_resume_after_kill_is_bit_exact(tmp_path: Path, nproc: int, stage: int) -> None:
    driver = Path(__file__).with_name("resume_driver.py")
    env = dict(os.environ, OMP_NUM_THREADS="1", SPOOLRL_FAULT="")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        env.pop(k, None)
    proc = subprocess.run([sys.executable, str(driver), str(tmp_path), str(nproc), str(stage)], env=env,
                          capture_output=True, text=True, timeout=560, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-5000:]
    r = json.loads(lines[0][len("RESULT "):])
    assert r["ref_status"] == [0] * nproc
    assert -signal.SIGKILL in r["crash_status"]  # killed after the step-2 checkpoint, before the spool commit
    assert r["latest_after_crash"] == "step_000002-g1"
    assert r["resume_status"] == [0] * nproc
    got = {int(k): v for k, v in r["run_losses"].items()}
    want = {int(k): v for k, v in r["ref_losses"].items()}
    assert got[1] == want[1] and got[2] == want[2]
    assert got[3] == want[3], (got, want)  # the step after the resume: bit for bit
    assert r["ledger"] == r["ledger_unique"] == 3 * 2 * 4
    if nproc == 2:
        # the same lineage resumed by one process: ZeRO-2 state of 2 ranks through a universal checkpoint
        assert r["universal_status"] == [0]
        assert r["universal_start"]["resumed_from"] == "step_000003-g2" and r["universal_start"]["world_size"] == 1
        assert r["universal_dir"]
        assert got[4] == pytest.approx(want[4], rel=1e-5, abs=1e-6)
