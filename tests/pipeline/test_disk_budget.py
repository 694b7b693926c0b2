"""Issue 14 item 7 (rest): a per-episode disk budget holds, and scratch cleanup removes trees the agent
made unwritable.

- A real rollout node (in process) on real bwrap sandboxes and the real EVAL harness: the agent applies
  the gold patch, then writes ~120 MiB into its work dir against ``rollout.scratch_per_episode_gb``
  = 0.05 (51 MiB). The watchdog measures the trees every few scans and kills the sandbox; the episode
  ends as the agent's outcome (status ok, reward 0 despite the gold patch, not evaluated, attempt 0);
  exactly-once audit of the spool.
- ``remove_dead_scratch`` / ``remove_tree`` as an unprivileged user (as the CI user when root, since root
  ignores permissions): a dead incarnation's tree with a ``chmod 000`` directory survives a plain
  ``shutil.rmtree`` and is removed by ours.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from hpc.config import load_config
from hpc.rundir import create_run
from hpc.spool import Spool
from hpc.trajectory import Status
from rollout_node.pipeline.bindings import RealTaskOps
from rollout_node.pipeline.node import NodeOptions, RolloutNode
from rollout_node.pipeline.policy import EpisodeContext
from rollout_node.pipeline.scripted import ScriptedPolicy
from rollout_node.pipeline.sizing import Workers
from rollout_node.sandbox import bwrap_unavailable_reason
from rollout_node.tasks import load_tasks
from tests.pipeline.readback import written
from tests.unprivileged import CI_USER, run_unprivileged

pytestmark = pytest.mark.sandbox
CONFIG = ["trainer.precision=fp32", "slurm.train.gpus_per_node=0", "model.path=/nonexistent",
          "spool.poll_interval_s=0.2", "spool.heartbeat_interval_s=1", "spool.shard_max_age_s=1",
          "rollout.policy=scripted", "rollout.scripted_plan=empty", "rollout.scratch_per_episode_gb=0.05",
          "rollout.metrics_interval_s=1", "algorithm.group_size=2"]
HOG = "for i in 1 2 3 4 5 6; do head -c 20M /dev/zero > blob$i; done; sleep 30"


class DiskHog(ScriptedPolicy):
    """The gold patch, then far more data than the episode's disk budget, then one more command."""

    def _do_empty(self, ctx: EpisodeContext) -> Status:
        self._do_gold(ctx)
        self._call(ctx, HOG, timeout_s=25)
        self._call(ctx, "git status --short")  # raises: the episode is over
        raise AssertionError("the sandbox kept answering past its disk budget")


@pytest.fixture(autouse=True)
def _need_sandbox() -> None:
    if why := bwrap_unavailable_reason():
        pytest.skip(why)


def test_episode_past_its_disk_budget_is_killed_and_scored_as_the_agents_outcome(tmp_path: Path) -> None:
    cfg = load_config(None, [*CONFIG, f"sandbox.scratch_dir={tmp_path / 'scratch'}"])
    paths = create_run(tmp_path / "run", cfg)
    ids = [t.instance_id for t in load_tasks("builtin")][:1]
    spool = Spool(paths.root, cfg.spool)
    spool.put_tasks([{"task_id": i, "instance_id": i, "group_size": 2} for i in ids])
    node = RolloutNode(paths, cfg, Spool(paths.root, cfg.spool), RealTaskOps(paths, cfg), DiskHog("empty"),
                       NodeOptions(node_id="n0", workers=Workers(1, 2, 1), scratch=tmp_path / "node", once=True))
    node.run()
    groups = written(paths, cfg)
    assert sorted(groups) == ids and all(sorted(t.sample_index for t in g) == [0, 1] for g in groups.values())
    for t in (t for g in groups.values() for t in g):
        assert (t.status, t.reward, t.metrics["sample_attempt"]) == (Status.OK, 0.0, 0), t.metrics
        assert "disk budget" in t.metrics["unscorable"] and t.metrics["eval_status"] == "unscorable", t.metrics
    stats = spool.stats()
    assert (stats["tasks_ready"], stats["tasks_claimed"], stats["tasks_done"]) == (0, 0, len(ids))
    assert not (tmp_path / "node").exists() or not any((tmp_path / "node").iterdir()), "node scratch removed"


CLEANUP = """
import json, os, shutil, subprocess, sys
from pathlib import Path
from rollout_node.pipeline.scratch import remove_dead_sandbox_scratch, remove_dead_scratch, remove_tree
base = Path(sys.argv[1])
dead = subprocess.Popen(["true"]); dead.wait()
def plant(root):
    (root / "w" / "locked" / "deep").mkdir(parents=True)
    (root / "w" / "locked" / "deep" / "f").write_text("x")
    (root / "w" / "locked").chmod(0)
    return root
plain = plant(base / "plain")
shutil.rmtree(plain, ignore_errors=True)
old = plant(base / f"n0.{dead.pid}.beef")
live = plant(base / f"n0.{os.getpid()}.cafe")
removed = remove_dead_scratch(base, "n0")
sbx_dead, sbx_live = plant(base / "sbx" / f"sbx-{dead.pid}-beef"), plant(base / "sbx" / f"sbx-{os.getpid()}-cafe")
removed += remove_dead_sandbox_scratch(base / "sbx")
print(json.dumps({"plain_survives": plain.exists(), "removed": [p.name for p in removed],
                  "dead_gone": not old.exists() and not sbx_dead.exists(), "live_kept": live.exists() and sbx_live.exists()}))
remove_tree(live); remove_tree(plain); remove_tree(base / "sbx")
print(json.dumps({"after": sorted(os.listdir(base))}))
"""


def test_scratch_cleanup_removes_trees_the_agent_made_unwritable() -> None:
    base = Path(tempfile.mkdtemp(prefix="spoolrl-scratch-test-"))
    try:
        if os.geteuid() == 0:
            shutil.chown(base, CI_USER, CI_USER)
        proc = run_unprivileged(sys.executable, "-c", CLEANUP, str(base), timeout=60)
        assert proc.returncode == 0, proc.stderr
        first, second = (json.loads(line) for line in proc.stdout.splitlines()[-2:])
        result: dict[str, Any] = first
        assert result["plain_survives"], "the fault reproduces: shutil.rmtree leaves a chmod-000 tree"
        assert result["dead_gone"] and result["live_kept"] and len(result["removed"]) == 2, result
        assert second["after"] == []
    finally:
        subprocess.run(["chmod", "-R", "u+rwx", str(base)], check=False)
        shutil.rmtree(base, ignore_errors=True)
