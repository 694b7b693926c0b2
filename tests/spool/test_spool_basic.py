"""Spool semantics in one process: tasks, leases, shards, groups, fencing, recovery, dedup, backpressure."""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from hpc.config.spool import SpoolConfig
from hpc.errors import FencedError, SpoolError
from hpc.fsutil import TmpCleaner
from hpc.shard import read_shard_file, shard_count
from hpc.spool import Spool
from hpc.trajectory import Status, Trajectory
from tests.spool.spool_helpers import backpressure, drop, keepalive, make_group, make_traj


def _consume_all(spool: Spool, consumer: str) -> list[Trajectory]:
    shards = spool.claim_shards(consumer, 1000)
    out = [t for s in shards for t in s.trajectories()]
    spool.commit(consumer, [s.shard_id for s in shards])
    return out


# ----------------------------------------------------------------------------------------- tasks


def test_put_tasks_is_idempotent_in_every_state(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    tasks = [{"task_id": f"repo__issue-{i}", "i": i} for i in range(4)] + [{"task_id": ".odd/id with spaces"}]
    assert spool.put_tasks(tasks) == 5
    assert spool.put_tasks(tasks) == 0
    lease = spool.claim_task("w1")
    assert lease is not None and lease.attempt == 0 and lease.task["task_id"] == lease.task_id
    assert spool.put_tasks(tasks) == 0  # claimed: still known
    assert spool.finish_task(lease)
    assert spool.put_tasks([{"task_id": lease.task_id}]) == 0  # done: the done marker keeps it known
    assert spool.stats()["tasks_done"] == 1
    with pytest.raises(SpoolError, match="task_id"):
        spool.put_tasks([{"name": "no id"}])


def test_release_returns_task_with_next_attempt(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    spool.put_tasks([{"task_id": "t"}])
    lease = spool.claim_task("w1")
    assert lease is not None
    assert spool.claim_task("w2") is None
    assert spool.release_task(lease)
    again = spool.claim_task("w2")
    assert again is not None and again.task_id == "t" and again.attempt == 1
    assert not spool.finish_task(lease)  # the released lease can no longer finish
    assert spool.finish_task(again)


def test_task_holders_name_the_worker_of_each_claim(tmp_path: Path) -> None:
    """What the rollout service reads to tell a caller which node held its job."""
    spool = Spool(tmp_path)
    spool.put_tasks([{"task_id": "a"}, {"task_id": "b"}, {"task_id": "c"}])
    first, second = spool.claim_task("w1"), spool.claim_task("w2")
    assert first is not None and second is not None
    assert spool.task_holders() == {first.task_id: "w1", second.task_id: "w2"}
    assert spool.finish_task(first) and spool.release_task(second)
    assert spool.task_holders() == {}


def test_expired_lease_is_reclaimed_and_its_finish_rejected(tmp_path: Path) -> None:
    config = SpoolConfig(lease_s=1.0, heartbeat_interval_s=0.2)
    spool = Spool(tmp_path, config)
    spool.put_tasks([{"task_id": "slow"}, {"task_id": "alive"}])
    dead = spool.claim_task("dead")
    live = spool.claim_task("live")
    assert dead is not None and live is not None
    reaper = Spool(tmp_path, config)
    assert reaper.tasks.reclaim_expired() == 0  # first sight: a fresh observer never reclaims
    with keepalive(spool, "live"):  # "live" keeps beating from a thread, "dead" does not
        for _ in range(3):
            time.sleep(0.6)
            reaper.tasks.reclaim_expired()
    stats = reaper.stats()
    assert (stats["tasks_ready"], stats["tasks_claimed"]) == (1, 1)
    assert not spool.finish_task(dead)  # late: rejected
    assert spool.finish_task(live)
    again = reaper.claim_task("other")
    assert again is not None and again.task_id == dead.task_id and again.attempt == 1


def test_a_dead_workers_task_comes_back_while_other_tasks_are_ready(tmp_path: Path) -> None:
    """The dead worker's task is reclaimed about one lease after its death and claimed again next, with
    the queue never dry (before: only a claim that found the queue empty watched for the dead)."""
    config = SpoolConfig(lease_s=1.0, heartbeat_interval_s=0.2)
    spool = Spool(tmp_path, config)
    spool.put_tasks([{"task_id": f"t{i}"} for i in range(200)])
    dead = spool.claim_task("dead")
    assert dead is not None
    live = Spool(tmp_path, config)
    seen: list[tuple[str, int]] = []
    deadline = time.monotonic() + 5.0
    while (dead.task_id, 1) not in seen and time.monotonic() < deadline:
        lease = live.claim_task("live")  # claiming beats the live worker's heartbeat
        assert lease is not None, "the queue ran dry"
        seen.append((lease.task_id, lease.attempt))
        assert live.finish_task(lease)
        time.sleep(0.05)
    assert (dead.task_id, 1) in seen, f"not reclaimed in 5 s ({len(seen)} claims)"
    assert live.stats()["tasks_ready"] > 100
    assert not spool.finish_task(dead)  # the dead worker's late finish is refused


def test_a_node_that_only_beats_still_reclaims_a_dead_workers_task(tmp_path: Path) -> None:
    """A node that may not claim (no inference server, backpressure) only heartbeats; the dead worker's task
    still goes back to ready about one lease after its death (before: only claims watched for the dead, so
    the lease was counted from this node's first claim after the outage)."""
    config = SpoolConfig(lease_s=1.0, heartbeat_interval_s=0.2)
    spool = Spool(tmp_path, config)
    spool.put_tasks([{"task_id": "t0"}])
    dead = spool.claim_task("dead")
    assert dead is not None
    idle = Spool(tmp_path, config)
    deadline = time.monotonic() + 5.0
    while idle.stats()["tasks_claimed"] and time.monotonic() < deadline:
        idle.heartbeat("idle")
        time.sleep(0.1)
    assert idle.stats()["tasks_claimed"] == 0, "the dead worker's claim was not reclaimed in 5 s"
    lease = idle.claim_task("idle")
    assert lease is not None and (lease.task_id, lease.attempt) == ("t0", 1)
    assert not spool.finish_task(dead)


# ----------------------------------------------------------------------------------------- shards


def test_groups_are_never_split_and_round_trip(tmp_path: Path) -> None:
    spool = Spool(tmp_path, SpoolConfig(shard_max_trajectories=5))
    groups = {f"t{i}": make_group(f"t{i}", 3 if i != 4 else 7) for i in range(8)}
    with spool.writer("w") as writer:
        for group in groups.values():
            writer.add_group(group)
    spool.fence("c")
    shards = spool.claim_shards("c", 100)
    for shard in shards:
        got = list(shard.trajectories())
        assert len(got) == shard_count(shard.shard_id)
        for task_id in {t.task_id for t in got}:
            assert sum(t.task_id == task_id for t in got) == len(groups[task_id]), "a group was split"
    by_id = {t.trajectory_id: t for s in shards for t in s.trajectories()}
    originals = [t for g in groups.values() for t in g]
    assert len(by_id) == len(originals)
    for orig in originals:
        back = by_id[orig.trajectory_id]
        assert back.meta() == orig.meta()
        for name in ("token_ids", "loss_mask", "logprobs", "policy_versions"):
            assert np.array_equal(getattr(back, name), getattr(orig, name))
            assert getattr(back, name).dtype == getattr(orig, name).dtype
            assert not getattr(back, name).flags.writeable, "records from a shard are frozen like constructed ones"


def test_fields_survive_and_shard_is_self_describing(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    traj = Trajectory(
        trajectory_id="x", task_id="t", group_id="g", sample_index=0, token_ids=np.array([1, 2, 3], np.int32),
        loss_mask=np.array([0, 1, 1], np.int8), logprobs=np.array([0.0, -1.5, -0.1], np.float32),
        policy_versions=np.array([-1, 4, 5], np.int32), reward=None, status=Status.SANDBOX_ERROR,
        timings={"run_s": 1.5}, metrics={"turns": 3, "tools": ["bash"]}, sampling={"temperature": 0.7}, attempt=2,
    )
    with spool.writer("w") as writer:
        writer.add(traj)
    (path,) = list(spool.ready.glob("*.shard"))
    table = read_shard_file(path)
    meta = table.schema.metadata
    assert meta[b"spoolrl.format"] == b"shard" and meta[b"spoolrl.trajectory_schema"] == b"1"
    assert str(table.schema.field("token_ids").type) == "list<item: int32>"
    (back,) = _consume_all(spool, "c")
    assert back.to_json() == traj.to_json()


def test_seal_by_size_and_by_age(tmp_path: Path) -> None:
    spool = Spool(tmp_path, SpoolConfig(shard_max_mb=0.01, shard_max_age_s=0.2))
    with spool.writer("w") as writer:
        for i in range(4):
            writer.add_group([make_traj(f"big{i}", 0, n_tokens=1000)])  # ~9 kB each: 0.01 MB holds one
        assert len(writer.published) >= 3
        writer.add(make_traj("young", 0))
        deadline = time.monotonic() + 10
        while writer.pending() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert writer.pending() == 0, "the age thread did not seal the open shard"
    assert spool.stats()["trajectories_ready"] == 5


# ----------------------------------------------------------------------------------------- consumer


def test_fencing_stops_a_stale_consumer(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    with spool.writer("w") as writer:
        writer.add_group(make_group("a", 2))
    old = Spool(tmp_path)
    assert old.fence("trainer") == 1
    shards = old.claim_shards("trainer", 10)
    new = Spool(tmp_path)
    assert new.fence("trainer") == 2  # a requeued trainer with the same id
    with pytest.raises(FencedError, match="generation 2"):
        old.commit("trainer", [s.shard_id for s in shards])
    with pytest.raises(FencedError):
        old.recover("trainer", [])
    with pytest.raises(FencedError):
        Spool(tmp_path).commit("never-fenced", [])
    assert new.recover("trainer", []) == {"committed": 0, "returned": 1}
    with pytest.raises(FencedError):
        old.claim_shards("trainer", 10)  # a stale trainer may not hoard shards either
    (shard,) = new.ready.glob("*.shard")  # ... but if it won a race and claimed one after recover:
    stale_dir = new.claimed / "trainer@g1"
    shard.rename(stale_dir / shard.name)
    assert len(_consume_all(new, "trainer")) == 2  # the current trainer sweeps it back and trains it
    assert new.stats()["trajectories_committed"] == 2
    assert list(stale_dir.iterdir()) == []
    with spool.writer("w") as writer:
        writer.add_group(make_group("b", 3))
    helper = Spool(tmp_path)  # a fresh object of the current trainer (same id) adopts its generation
    assert len(_consume_all(helper, "trainer")) == 3


def test_recover_commits_checkpointed_and_returns_the_rest(tmp_path: Path) -> None:
    spool = Spool(tmp_path, SpoolConfig(shard_max_trajectories=2))
    with spool.writer("w") as writer:
        for i in range(3):
            writer.add_group(make_group(f"t{i}", 2))
    crashed = Spool(tmp_path)
    crashed.fence("trainer")
    ids = [s.shard_id for s in crashed.claim_shards("trainer", 3)]
    assert len(ids) == 3
    successor = Spool(tmp_path)
    successor.fence("trainer")
    assert successor.recover("trainer", ids[:1]) == {"committed": 1, "returned": 2}
    stats = successor.stats()
    assert (stats["shards_committed"], stats["shards_ready"], stats["shards_claimed"]) == (1, 2, 0)
    assert {t.task_id for t in _consume_all(successor, "trainer")} == {"t1", "t2"}


def test_duplicate_task_results_are_dropped_and_recorded(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    for worker, tag in (("fresh", ""), ("late", "-late")):
        with spool.writer(worker) as writer:
            writer.add_group(make_group("t", 4, tag=tag))
            writer.add_group(make_group(f"only-{worker}", 2))
    spool.fence("c")
    trained = _consume_all(spool, "c")
    assert sorted(t.task_id for t in trained).count("t") == 4
    assert len(trained) == 8
    assert spool.stats()["trajectories_dropped_duplicate"] == 4
    with spool.writer("third") as writer:  # after a trainer restart too
        writer.add_group(make_group("t", 4, tag="-third"))
    restarted = Spool(tmp_path)
    restarted.fence("c")
    restarted.recover("c", [])
    assert _consume_all(restarted, "c") == []
    assert restarted.stats()["trajectories_dropped_duplicate"] == 8


def test_backpressure_counts_unconsumed_shards(tmp_path: Path) -> None:
    spool = Spool(tmp_path, SpoolConfig(shard_max_trajectories=1, max_ready_shards=3))
    with spool.writer("w") as writer:
        writer.add_group(make_group("a", 1))
        writer.add_group(make_group("b", 1))
        assert spool.pending_work() == 2 and not backpressure(spool)
        writer.add_group(make_group("c", 1))
        assert spool.pending_work() == 3 and backpressure(spool)
    spool.claim_shards("c", 2)
    assert spool.pending_work() == 1 and not backpressure(spool)


def test_drop_records_account_for_trajectories(tmp_path: Path) -> None:
    spool = Spool(tmp_path)
    drop(spool, make_group("stale", 3), reason="too_stale", process="trainer")
    assert spool.stats()["trajectories_dropped_other"] == 3
    (record,) = [json.loads(p.read_text()) for p in spool.dropped_dir.iterdir()]
    assert record["reason"] == "too_stale" and len(record["trajectories"]) == 3


def test_claim_survives_a_rename_that_reports_enoent_after_succeeding(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spool = Spool(tmp_path)
    spool.put_tasks([{"task_id": "t"}])
    real_rename = os.rename

    def retransmitted(src: object, dst: object) -> None:  # NFS: the retry of a done rename answers ENOENT
        real_rename(src, dst)  # type: ignore[arg-type]
        raise FileNotFoundError(errno.ENOENT, "No such file or directory")

    monkeypatch.setattr(os, "rename", retransmitted)
    lease = spool.claim_task("w")
    monkeypatch.undo()
    assert lease is not None and lease.task_id == "t"  # it looked into its own claim directory
    assert spool.claim_task("other") is None


def test_liveness_reads_counters_never_mtimes(tmp_path: Path) -> None:
    config = SpoolConfig(lease_s=1.0, heartbeat_interval_s=0.2)
    spool = Spool(tmp_path, config)
    spool.put_tasks([{"task_id": "a"}, {"task_id": "b"}])
    assert spool.claim_task("beating-old-mtime") and spool.claim_task("silent-fresh-mtime")
    reaper = Spool(tmp_path, config)
    reaper.tasks.reclaim_expired()
    hb_dir = spool.heartbeat_dir
    for _ in range(3):
        time.sleep(0.5)
        spool.heartbeat("beating-old-mtime")
        os.utime(hb_dir / "beating-old-mtime", (0, 0))  # 1970: a clock-based check would call it dead
        os.utime(hb_dir / "silent-fresh-mtime")  # touched now, counter unchanged: dead
        reaper.tasks.reclaim_expired()
    stats = reaper.stats()
    assert (stats["tasks_ready"], stats["tasks_claimed"]) == (1, 1)
    assert os.listdir(spool.tasks.claimed / "beating-old-mtime")


def test_temporaries_of_other_hosts_are_cleaned_by_monotonic_age(tmp_path: Path) -> None:
    leftover = tmp_path / ".tmp@4242@some-other-host@0001-shard"
    leftover.write_bytes(b"half a shard")
    cleaner = TmpCleaner(max_age_s=0.3)
    assert cleaner.clean(tmp_path, os.listdir(tmp_path)) == 0  # first sight: its writer may live
    time.sleep(0.4)
    assert cleaner.clean(tmp_path, os.listdir(tmp_path)) == 1
    assert not leftover.exists()
