"""Crash safety with real processes: a claimer stopped past its lease, and SIGKILLs of writers and
consumers at random points over 50+ rounds."""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections import Counter
from pathlib import Path

from hpc.config.spool import SpoolConfig
from hpc.shard import SUFFIX, read_shard_file
from hpc.spool import Spool
from tests.spool.spool_helpers import consumer, make_group, shard_writer, start, stopped_worker


def _wait_state(pid: int, state: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        if fields[0] == state:
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} never reached state {state}")


def test_stopped_claimer_resumed_late_is_not_trained_twice(tmp_path: Path) -> None:
    config = SpoolConfig(lease_s=1.0, heartbeat_interval_s=0.5)
    spool = Spool(tmp_path, config)
    spool.put_tasks([{"task_id": "T"}])
    proc = start(stopped_worker, str(tmp_path), "sleepy", config)
    _wait_state(proc.pid, "T")  # claimed T, then SIGSTOPped itself
    reaper = Spool(tmp_path, config)
    deadline = time.monotonic() + 30
    while not reaper.tasks.reclaim_expired():
        assert time.monotonic() < deadline, "the stopped worker's lease was never reclaimed"
        time.sleep(0.2)
    lease = reaper.claim_task("fresh")
    assert lease is not None and lease.task_id == "T" and lease.attempt == 1
    with reaper.writer("fresh") as writer:
        writer.add_group(make_group("T", 4, attempt=lease.attempt))
    assert reaper.finish_task(lease)
    os.kill(proc.pid, signal.SIGCONT)  # the late worker now delivers its results and tries to finish
    proc.join(60)
    assert proc.exitcode == 0
    late = json.loads((tmp_path / "sleepy.json").read_text())
    assert late == {"finished": False, "attempt": 0}
    trainer = Spool(tmp_path, config)
    trainer.fence("trainer")
    shards = trainer.claim_shards("trainer", 10)
    assert len(shards) == 2  # both deliveries reached the spool ...
    trained = [t for s in shards for t in s.trajectories()]
    trainer.commit("trainer", [s.shard_id for s in shards])
    assert len(trained) == 4 and {t.task_id for t in trained} == {"T"}  # ... only one is trained
    assert len({t.attempt for t in trained}) == 1
    stats = trainer.stats()
    assert stats["trajectories_dropped_duplicate"] == 4 and stats["trajectories_committed"] == 8
    assert stats["tasks_done"] == 1 and stats["tasks_ready"] == 0


def _published_shards(spool: Spool) -> dict[str, str]:
    """shard file name -> state, over every place a shard can be."""
    out = {n: "ready" for n in os.listdir(spool.ready) if n.endswith(SUFFIX)}
    out.update({n: "committed" for n in os.listdir(spool.committed)})
    for d in os.listdir(spool.claimed):
        out.update({n: f"claimed:{d}" for n in os.listdir(spool.claimed / d)})
    return out


def test_sigkill_writers_and_consumers_at_random_points(tmp_path: Path) -> None:
    rng = random.Random(1234)
    config = SpoolConfig(shard_max_trajectories=4)
    rounds = 50
    for r in range(rounds):
        procs = [start(shard_writer, str(tmp_path), f"w{r}-{k}", 0, 6, config) for k in range(2)]
        procs.append(start(consumer, str(tmp_path), "trainer", config, 40))
        time.sleep(rng.uniform(0.0, 0.08))
        for p in procs:
            if rng.random() < 0.8:
                # Process.kill, not os.kill: a worker that already ended may have been reaped by
                # multiprocessing (Process.start reaps finished children), and its pid gone
                p.kill()
        for p in procs:
            p.join(60)
            assert p.exitcode in (0, -signal.SIGKILL), f"worker failed: exit {p.exitcode}"
    # The final trainer restarts from the latest checkpoint and drains what is left.
    consumer(str(tmp_path), "trainer", config, 0)
    spool = Spool(tmp_path, config)
    ckpt = json.loads((tmp_path / "checkpoint.json").read_text())["shards"]
    states = _published_shards(spool)
    assert not [n for n, s in states.items() if s.startswith("claimed")], "recover left claimed shards"
    committed = {n[: -len(SUFFIX)] for n, s in states.items() if s == "committed"}
    twice = [sid for sid, n in Counter(ckpt).items() if n > 1]
    assert twice == [], f"shards trained twice: {twice[:3]}"
    assert committed == set(ckpt), "committed shards and checkpointed (trained) shards differ"
    logged = {line for p in tmp_path.glob("writer-*.log") for line in p.read_text().split()}
    assert logged and logged <= {n[: -len(SUFFIX)] for n in states}, "a published shard was lost"
    seen: Counter[str] = Counter()
    for name, state in states.items():
        path = spool.ready / name if state == "ready" else spool.committed / name
        seen.update(read_shard_file(path).column("trajectory_id").to_pylist())
    assert max(seen.values()) == 1, "a trajectory is in two shards"
    assert spool.stats()["shards_quarantined"] == 0
    spool.claim_shards("observer", 0)  # a listing of ready/ cleans temporaries of dead writers
    assert [n for n in os.listdir(spool.ready) if n.startswith(".")] == []
    assert len(committed) > rounds // 5, "too few commits: the test exercised little"
