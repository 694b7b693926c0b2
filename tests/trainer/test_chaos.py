"""Exactly once under chaos: SIGKILL the trainer at random instants and at every named fault point.

The driver (``chaos_driver.py``, its own process) interleaves a producer writing a known set of
trajectories with trainer episodes that die: >= 20 random external SIGKILLs and >= 3 self-inflicted
ones at each fault point (in a step, in a checkpoint, between checkpoint and spool commit, during
publish), each resumed by the next episode; a final clean run drains the spool. Every produced
trajectory must then appear exactly once in the lineage's ledgers: trained or dropped with a reason.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.deepspeed, pytest.mark.timeout(900)]

RANDOM_KILLS = int(os.environ.get("SPOOLRL_CHAOS_KILLS", "20"))
PER_POINT = int(os.environ.get("SPOOLRL_CHAOS_PER_POINT", "3"))


def test_every_trajectory_accounted_once_under_chaos(tmp_path: Path) -> None:
    driver = Path(__file__).with_name("chaos_driver.py")
    proc = subprocess.run([sys.executable, str(driver), str(tmp_path / "run"), str(RANDOM_KILLS), str(PER_POINT), "0"],
                          capture_output=True, text=True, timeout=850, check=False,
                          env=dict(os.environ, OMP_NUM_THREADS="1", SPOOLRL_FAULT=""))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    result = json.loads(lines[0][len("RESULT "):])
    episodes, audit = result["episodes"], result["audit"]
    assert sum(1 for e in episodes if e["killed"] and e["signal"] == 9) == RANDOM_KILLS
    for point in ("step", "checkpoint", "after_checkpoint", "publish"):
        died = [e for e in episodes if e["fault"].startswith(point + ":") and e["signal"] == 9 and not e["killed"]]
        assert len(died) >= PER_POINT, (point, episodes)
    assert result["final"]["exit"] == 0
    assert audit["missing"] == [] and audit["extra"] == [] and audit["twice"] == [], audit
    assert audit["ledger"] == audit["produced"]
    assert audit["tasks_trained_twice"] == []
    assert audit["spool_ready"] == 0 and audit["spool_claimed"] == 0
    outcomes = audit["outcomes"]
    for reason in ("trained", "dropped:zero_variance", "dropped:sandbox_error", "dropped:duplicate_task",
                   "dropped:stale"):
        assert outcomes.get(reason, 0) > 0, outcomes
