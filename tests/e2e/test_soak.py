"""Issue 37: ``scripts/soak.py`` for 3 minutes, every role SIGKILLed at least once, then its audit.

The soak runs the demo's real roles (CPU engine under ``infer-node``, a bwrap rollout node with
EVAL, the DeepSpeed trainer) and ``rollout-server`` with a ``/process`` client beside them; it kills
each role at least once (some trainer incarnations also at a checkpoint or publish fault point), stops and
resumes the whole run once, drains, and audits. This test asserts the script's own exit status
and every check of its summary, and that the chaos it claims really happened (kills and restarts
per role, tasks trained, ``/process`` calls answered).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.sandbox, pytest.mark.deepspeed, pytest.mark.timeout(1800)]
ROOT = Path(__file__).resolve().parents[2]
CHECKS = {"tasks", "process_calls", "reloads", "trainer_wait", "run_down", "leaks", "advantages", "chaos"}


def test_three_minute_soak_loses_nothing_and_leaks_nothing(tmp_path: Path) -> None:
    out = tmp_path / "soak"
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "soak.py"), "--minutes", "3", "--seed", "0",
                           "--out", str(out)], capture_output=True, text=True, timeout=1700, cwd=ROOT,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    summary_file = out / "soak.json"
    assert summary_file.exists(), proc.stdout[-4000:] + proc.stderr[-4000:]
    summary = json.loads(summary_file.read_text())
    checks = summary["checks"]
    assert set(checks) == CHECKS
    failed = {name: c for name, c in checks.items() if not c["ok"]}
    assert not failed and proc.returncode == 0, json.dumps(failed, indent=1) + proc.stdout[-3000:]
    kills = summary["kills"]  # role -> phase -> count
    for role in ("rollout", "infer-server", "raas", "trainer"):
        assert sum(kills.get(role, {}).values()) >= 1, kills
    # the first kill of a role waits for its phase; a 3-minute window on a loaded host may see no
    # reload or checkpoint in time (the 30-minute run in the README does): these two always come
    assert kills["rollout"].get("eval", 0) + kills["raas"].get("call", 0) >= 1, kills
    assert all(n >= 2 for n in summary["starts"].values()), summary["starts"]  # killed or resumed: started again
    assert checks["tasks"]["fates"].get("trained", 0) > 0 and checks["tasks"]["lost"] == []
    assert any(o.startswith("result:") for o in checks["process_calls"]["outcomes"])
    assert checks["trainer_wait"]["steps"] > 0
