"""``scripts/stale_demo.py``, the forced-staleness arms of ``scripts/bench_learning.py --staleness``, through a real
``spoolrl demo`` (CPU engine, bwrap sandboxes, EVAL, spool, DeepSpeed): with ``--lag 1`` the inference server
stays one version behind, so every step after the first trains on samples exactly one version old; with
``--no-is-weight`` the trainer applies no importance weight. Small: the random tiny model, 1 group of 2 samples,
3 steps."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hpc.metrics import read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.sandbox, pytest.mark.deepspeed]
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(400)
def test_the_served_version_lags_by_one_and_no_weight_is_applied(tmp_path: Path) -> None:
    run = tmp_path / "run"
    argv = [sys.executable, str(ROOT / "scripts" / "stale_demo.py"), "--lag", "1", "--no-is-weight", "--",
            "--out", str(run), "--steps", "3", "model.path=tiny", "algorithm.groups_per_step=1",
            "algorithm.group_size=2", "trainer.max_tasks_outstanding=1", "trainer.prefetch=false",
            "algorithm.max_staleness=1", "trainer.keep_policies=3"]
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=360, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    steps = sorted(read_metrics(run, "train_step"), key=lambda r: r["step"])
    # step s trains at version s - 1 on samples of version max(0, s - 2): the initial model twice, then v1
    assert [r["staleness_hist"] for r in steps] == [{"0": 2}, {"1": 2}, {"1": 2}], steps
    reloads = sorted(int(r["version"]) for r in read_metrics(run, "reload"))
    assert reloads[:1] == [1] and max(reloads) <= 2, f"the server reloads LATEST - 1 only: {reloads}"
    assert [r["weight_mean"] for r in steps] == [1.0, 1.0, 1.0], "no importance weight applied"
    assert all(set(r["by_staleness"]) == set(r["staleness_hist"]) for r in steps), "ratios logged per age"
