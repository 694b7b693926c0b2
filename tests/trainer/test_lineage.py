"""Resume restores the policy too: the servers get the restored weights, discarded versions' samples are dropped."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.deepspeed, pytest.mark.timeout(600)]


def test_resume_republishes_restored_weights_and_drops_discarded_lineage(tmp_path: Path) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", SPOOLRL_FAULT="")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT"):
        env.pop(k, None)
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("lineage_driver.py")), str(tmp_path)],
                          env=env, capture_output=True, text=True, timeout=560, check=False)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-5000:]
    r = json.loads(lines[0][len("RESULT "):])
    assert r["crash"] == [-signal.SIGKILL] and r["latest_after_crash"] in ("4", "5")
    assert r["checkpoint_after_crash"].startswith("step_000003-"), r  # v4 (v5) were published, never checkpointed
    assert r["resume"] == [0]
    assert r["discarded"] == [[4, int(r["latest_after_crash"])]] and r["discard_before_steps"], r
    assert r["restored_equals_v3"] and r["restored_differs_from_v4"], r  # the restored weights, a new version
    assert r["late_outcomes"] == [["dropped", "discarded_lineage"]], r
    assert r["ok_trained"] == 8 and r["unique"], r
