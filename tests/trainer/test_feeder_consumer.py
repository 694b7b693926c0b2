"""Feeder order/backpressure/resume and consumer accounting, against the real spool (no DeepSpeed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

from hpc.config import AlgorithmConfig
from hpc.spool import Spool
from train_node.trainer.consumer import Consumer, ConsumerState
from train_node.trainer.feeder import Feeder, epoch_order

from .helpers import make_group, write_groups


def test_feeder_ids_order_backpressure_and_resume(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    ids = [f"inst-{i}" for i in range(5)]
    f = Feeder(ids, epochs=2, seed=7, group_size=4, max_outstanding=3)
    assert f.top_up(spool, tasks_resolved=0, policy_version=0) == 3
    assert f.top_up(spool, tasks_resolved=0, policy_version=0) == 0  # 3 outstanding: full
    assert f.top_up(spool, tasks_resolved=2, policy_version=1) == 2
    order0 = epoch_order(ids, 7, 0)
    assert f.task_at(0, 0)["task_id"] == f"{order0[0]}@e0"
    assert f.task_at(5, 0)["task_id"] == f"{epoch_order(ids, 7, 1)[0]}@e1"
    assert order0 != epoch_order(ids, 7, 1) and sorted(order0) == sorted(ids)
    assert f.task_at(3, 9)["policy_version"] == 9 and f.task_at(3, 9)["group_size"] == 4
    # resume from a checkpoint taken at position 2: re-putting positions 2..4 is a no-op in the spool
    g = Feeder(ids, epochs=2, seed=7, group_size=4, max_outstanding=10)
    g.restore({"next_position": 2})
    before = spool.stats()["tasks_ready"]
    g.top_up(spool, tasks_resolved=2, policy_version=3)
    assert spool.stats()["tasks_ready"] == before + (10 - 5)
    assert g.exhausted


def test_consumer_outcomes_and_restart_skip(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    groups = [make_group("a@e0", [1, 0, 1, 0], rng, version=4), make_group("b@e0", [1, 1, 1, 1], rng, version=4),
              make_group("c@e0", [1, 0, 0, 0], rng, version=0), make_group("d@e0", [0, 1, 0, 1], rng, version=3)]
    write_groups(tmp_path, groups)
    acfg = AlgorithmConfig(group_size=4, groups_per_step=2, max_staleness=2)
    spool = Spool(tmp_path)
    spool.fence("t")
    c = Consumer(spool, "t", acfg, max_seq_len=1000)
    c.poll()
    batch = c.next_batch(trainer_version=5, num_groups=2)  # c is stale at version 5
    assert batch is not None and batch.task_ids == ["a@e0", "d@e0"]
    assert c.drops == {"zero_variance": 4, "stale": 4}
    assert abs(sum(s.advantage for s in batch.samples)) < 1e-6
    c.mark_trained(batch, step=1)
    ledger, covered, state = c.take_checkpoint_delta()
    assert len(ledger) == 16 and len({e["trajectory_id"] for e in ledger}) == 16 and len(covered) == 4
    assert set(state["trained_tasks"]) == {"a@e0", "d@e0"}
    # the same task again (another writer): never trained twice in the lineage
    write_groups(tmp_path, [make_group("a@e0", [1, 0, 0, 1], rng, group="a@e0#2")], worker="other")
    c2 = Consumer(spool, "t", acfg, max_seq_len=1000, state=ConsumerState.from_json(state))
    c2.poll()
    assert c2.next_batch(5, 1, allow_partial=True) is None
    assert sum(c2.drops.values()) == 4 and set(c2.drops) == {"duplicate_task"}


def test_checkpoints_cli_lists_lineage(tmp_path: Path) -> None:
    root = tmp_path / "run"
    (root / "checkpoints" / "step_000002").mkdir(parents=True)
    (root / "checkpoints" / "step_000004" / "ds").mkdir(parents=True)
    meta2 = {"step": 2, "policy_version": 2, "parent": None, "shards": ["s1", "s2"], "world_size": 1}
    meta4 = {"step": 4, "policy_version": 5, "parent": "step_000002", "shards": ["s3"], "world_size": 2}
    (root / "checkpoints" / "step_000002" / "meta.json").write_text(json.dumps(meta2))
    (root / "checkpoints" / "step_000004" / "meta.json").write_text(json.dumps(meta4))
    (root / "checkpoints" / "LATEST").write_text("step_000004\n")
    out = subprocess.run([sys.executable, "-m", "hpc.cli", "checkpoints", str(root), "--json"], capture_output=True,
                         text=True, check=True).stdout
    rows = json.loads(out)["checkpoints"]
    assert [(r["step"], r["policy_version"], r["shards"], r["has_state"]) for r in rows] == \
        [(2, 2, ["s1", "s2"], False), (4, 5, ["s3"], True)]
    table = subprocess.run([sys.executable, "-m", "hpc.cli", "checkpoints", str(root)], capture_output=True,
                           text=True, check=True).stdout
    assert "step_000004" in table and "s3" in table
