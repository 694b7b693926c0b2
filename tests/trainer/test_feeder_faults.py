"""The feeder never stalls (issue 14, item 2): a quarantined shard's task, a task file lost to a read
error and a duplicate instance id are resolved, and the run reaches its step target.

A producer in the test claims tasks from the real spool and writes one real group per task; the
first shard it publishes has one byte flipped (quarantined at claim) and one task file in
``tasks/ready`` is garbage when claimed (unlinked by the task queue). Each test ends with the
exactly-once audit: every produced trajectory is trained once or dropped with a reason in the
lineage, or lies in the quarantined shard, or is still queued; no task is trained twice.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hpc.config import AlgorithmConfig
from hpc.config.spool import SpoolConfig
from hpc.metrics import read_metrics
from hpc.shard import SUFFIX, ShardWriter
from hpc.spool import Spool
from train_node.trainer import checkpoint as ckpt
from train_node.trainer.consumer import Consumer
from train_node.trainer.feeder import Feeder
from train_node.trainer.loop import Options, Trainer

from .helpers import make_group, make_run, run_config, single_process_env


class Producer:
    """A rollout node's spool side: claim, write the group (first shard corrupted), finish."""

    def __init__(self, root: Path, config: SpoolConfig) -> None:
        self.spool = Spool(root, config)
        self.staging = root / "producer-staging"
        self.staging.mkdir()
        self.config = config
        self.rng = np.random.default_rng(1)
        self.produced: dict[str, str] = {}  # trajectory id -> shard id
        self.tasks_run: list[str] = []
        self.corrupt_shard: str | None = None
        self.garbage_task: str | None = None
        self.runs = 0

    def spoil_a_task_file(self) -> bool:
        """Overwrite one ready task file with bytes that are no task (its reader unlinks it)."""
        names = sorted(n for n in os.listdir(self.spool.tasks.ready) if not n.startswith("."))
        if self.garbage_task is not None or len(names) < 2:
            return False
        self.garbage_task = names[-1]
        (self.spool.tasks.ready / names[-1]).write_bytes(b"\x00\xff not json")
        return True

    def run_one(self) -> bool:
        lease = self.spool.claim_task("producer")
        if lease is None:
            return False
        self.runs += 1
        group = [dataclasses.replace(t, trajectory_id=f"{t.trajectory_id}#run{self.runs}", attempt=lease.attempt)
                 for t in make_group(lease.task_id, [1.0, 0.0], self.rng, gen_len=6)]
        if self.corrupt_shard is None:
            self.corrupt_shard = self._publish_corrupt(group)
            sid = self.corrupt_shard
        else:
            with self.spool.writer("producer") as w:
                w.add_group(group)
                sid = str(w.flush() or w.published[-1])
        self.produced.update((t.trajectory_id, sid) for t in group)
        self.tasks_run.append(lease.task_id)
        assert self.spool.finish_task(lease)
        return True

    def _publish_corrupt(self, group: list[Any]) -> str:
        w = ShardWriter(self.staging, "producer", self.config)
        w.add_group(group)
        sid = w.flush()
        assert sid is not None
        data = bytearray((self.staging / f"{sid}{SUFFIX}").read_bytes())
        data[len(data) // 2] ^= 0x01  # one byte flipped on the shared filesystem
        (self.staging / f"{sid}{SUFFIX}").write_bytes(bytes(data))
        os.rename(self.staging / f"{sid}{SUFFIX}", self.spool.ready / f"{sid}{SUFFIX}")
        return sid


def _audit(root: Path, producer: Producer, ledger: list[dict[str, Any]]) -> dict[str, Any]:
    """Each produced trajectory in exactly one place: the ledger, the quarantined shard, or still queued."""
    spool_dir = root / "spool" / "shards"
    quarantined = {p.name[: -len(SUFFIX)] for p in (spool_dir / "quarantine").glob(f"*{SUFFIX}")}
    queued = {p.name[: -len(SUFFIX)] for p in (spool_dir / "ready").glob(f"*{SUFFIX}")}
    queued |= {p.name[: -len(SUFFIX)] for p in (spool_dir / "claimed").glob(f"*/*{SUFFIX}")}
    counts: dict[str, int] = {}
    for e in ledger:
        counts[e["trajectory_id"]] = counts.get(e["trajectory_id"], 0) + 1
    places = {tid: int(tid in counts) + int(sid in quarantined) for tid, sid in producer.produced.items()}
    trained: dict[str, set[int]] = {}  # task -> the steps that trained it
    for e in ledger:
        if e["outcome"] == "trained":
            trained.setdefault(e["task_id"], set()).add(e["step"])
    return {
        "twice_in_ledger": sorted(t for t, n in counts.items() if n > 1),
        "unknown": sorted(set(counts) - set(producer.produced)),
        "nowhere": sorted(t for t, n in places.items() if n == 0 and producer.produced[t] not in queued),
        "two_places": sorted(t for t, n in places.items() if n > 1),
        "quarantined": quarantined,
        "tasks_trained": trained,
    }


def test_feeder_resolves_quarantined_lost_and_duplicate_tasks(tmp_path: Path) -> None:
    """Real spool, real consumer, no engine: the dataset finishes although three things went wrong."""
    ids = [f"inst-{i}" for i in range(6)]
    spool = Spool(tmp_path, SpoolConfig())
    spool.fence("trainer")
    acfg = AlgorithmConfig(group_size=2, groups_per_step=1, max_staleness=10)
    consumer = Consumer(spool, "trainer", acfg, max_seq_len=1000)
    feeder = Feeder(ids + [ids[2]], epochs=1, seed=3, group_size=2, max_outstanding=3)
    assert feeder.duplicates == 1 and feeder.total == 6
    producer = Producer(tmp_path, SpoolConfig())
    step = 0
    for _ in range(60):
        if feeder.finished:
            break
        feeder.top_up(spool, consumer, policy_version=0)
        producer.spoil_a_task_file()
        while producer.run_one():
            pass
        consumer.poll()
        while (batch := consumer.next_batch(0, 1)) is not None:
            step += 1
            consumer.mark_trained(batch, step)
    assert feeder.finished, (feeder.outstanding, feeder.events)
    events = {(e["event"], e.get("how")) for e in feeder.events}
    assert ("task_reissued", "reissued") in events  # the quarantined shard's task: done -> ready, next attempt
    assert ("task_reissued", "re-put") in events  # the task whose file was unreadable
    assert feeder.lost == []
    ledger = consumer.take_checkpoint_delta()[0]
    audit = _audit(tmp_path, producer, ledger)
    assert audit["quarantined"] == {producer.corrupt_shard}
    assert audit["twice_in_ledger"] == audit["unknown"] == audit["nowhere"] == audit["two_places"] == []
    assert sorted(audit["tasks_trained"]) == sorted(f"{i}@e0" for i in ids)
    assert all(len(steps) == 1 for steps in audit["tasks_trained"].values())


@pytest.mark.deepspeed
@pytest.mark.timeout(300)
def test_corrupted_shard_mid_run_still_reaches_the_step_target(tmp_path: Path) -> None:
    """The measured stall: the first shard quarantined; the trainer (real DeepSpeed, gloo) still
    trains every task of the dataset and stops at its step target."""
    cfg = run_config(trainer={"total_steps": 4, "checkpoint_every": 2, "max_tasks_outstanding": 3},
                     algorithm={"group_size": 2, "groups_per_step": 2})
    paths = make_run(tmp_path / "run", cfg)
    ids = [f"inst-{i}" for i in range(8)]  # 8 tasks, 2 per step: step 4 needs every one of them trained
    producer = Producer(paths.root, cfg.spool)
    stop = threading.Event()

    def produce() -> None:
        while not stop.is_set():
            producer.spoil_a_task_file()
            if not producer.run_one():
                time.sleep(0.05)

    thread = threading.Thread(target=produce, daemon=True)
    trainer = Trainer(paths.root, cfg, Options(instance_ids=ids + [ids[5]], max_idle_s=30.0),
                      dist=single_process_env())
    trainer.setup()
    thread.start()
    try:
        assert trainer.run() == 0
    finally:
        stop.set()
        thread.join(timeout=30)
    assert [s["step"] for s in read_metrics(paths.root, "train_step")] == [1, 2, 3, 4]
    stop_record = list(read_metrics(paths.root, "trainer_stop"))[-1]
    assert stop_record["reason"] in ("total_steps", "dataset_done"), stop_record
    reissued = [r["how"] for r in read_metrics(paths.root, "task_reissued")]
    assert "reissued" in reissued and "re-put" in reissued, reissued
    ledger = [e for m in ckpt.lineage(paths) for e in ckpt.read_ledger(paths, m["tag"])]
    audit = _audit(paths.root, producer, ledger)
    assert audit["quarantined"] == {producer.corrupt_shard}
    assert audit["twice_in_ledger"] == audit["unknown"] == audit["nowhere"] == audit["two_places"] == []
    assert sorted(audit["tasks_trained"]) == sorted(f"{i}@e0" for i in ids)
    assert all(len(steps) == 1 for steps in audit["tasks_trained"].values())
