"""Helpers of the spool tests: trajectory builders, the bodies of forked worker processes, and the
spool calls only tests (and ``scripts/bench_spool.py``) make: ``keepalive``, ``backpressure``,
``drop``, ``wait_for_shards`` (production's calls are listed in :mod:`hpc.spool`).

Workers run in real processes (``fork``: no interpreter start-up per process, so hundreds of
processes stay cheap) and report through files, never through shared memory.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import random
import secrets
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hpc.config.spool import SpoolConfig
from hpc.errors import SpoolError
from hpc.fsutil import publish_file, safe_name
from hpc.spool import Shard, Spool
from hpc.trajectory import Trajectory

CTX = multiprocessing.get_context("fork")


def make_traj(task_id: str, sample: int, *, n_tokens: int = 32, attempt: int = 0, tag: str = "") -> Trajectory:
    prompt = min(8, n_tokens // 2)
    mask = np.array([0] * prompt + [1] * (n_tokens - prompt), dtype=np.int8)
    return Trajectory(
        trajectory_id=f"{task_id}/{sample}/{attempt}{tag}", task_id=task_id, group_id=f"{task_id}#g",
        sample_index=sample, token_ids=((np.arange(n_tokens) * 7 + sample) % 50000).astype(np.int32), loss_mask=mask,
        logprobs=np.where(mask == 1, -0.25, 0.0).astype(np.float32),
        policy_versions=np.where(mask == 1, 2, -1).astype(np.int32),
        reward=float(sample % 2), attempt=attempt, prompt_len=prompt,
    )


def make_group(task_id: str, size: int, **kw: Any) -> list[Trajectory]:
    return [make_traj(task_id, i, **kw) for i in range(size)]


def start(target: Callable[..., None], *args: Any) -> Any:
    proc = CTX.Process(target=target, args=args, daemon=True)
    proc.start()
    return proc


def join_all(procs: Sequence[Any], timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    for p in procs:
        p.join(max(0.1, deadline - time.monotonic()))
    alive = [p.pid for p in procs if p.is_alive()]
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    assert not alive, f"workers {alive} did not finish within {timeout_s} s"
    bad = [(p.pid, p.exitcode) for p in procs if p.exitcode != 0]
    assert not bad, f"workers failed (pid, exit code): {bad}"


def write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------ test-only spool calls


@contextlib.contextmanager
def keepalive(spool: Spool, worker_id: str) -> Iterator[None]:
    """Heartbeat ``worker_id`` every ``heartbeat_interval_s`` from a thread while the block runs."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(spool.config.heartbeat_interval_s):
            with contextlib.suppress(SpoolError):
                spool.heartbeat(worker_id)

    spool.heartbeat(worker_id)
    thread = threading.Thread(target=beat, name=f"heartbeat-{worker_id}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def backpressure(spool: Spool) -> bool:
    """The rollout node's backpressure rule (``ClaimGate``): too much unconsumed work."""
    return spool.pending_work() >= spool.config.max_ready_shards


def drop(spool: Spool, trajectories: Sequence[Trajectory], reason: str, process: str) -> None:
    """Write a ``dropped/`` record (the format ``Spool.stats`` counts as ``trajectories_dropped_other``)."""
    rows = [{"trajectory_id": t.trajectory_id, "task_id": t.task_id, "reason": reason} for t in trajectories]
    record = {"process": process, "reason": reason, "t": time.time(), "trajectories": rows}
    name = f"{int(time.time() * 1000):013d}-{safe_name(process)}-{secrets.token_hex(4)}.json"
    publish_file(spool.dropped_dir / name, json.dumps(record).encode())


def wait_for_shards(spool: Spool, consumer_id: str, max_shards: int, timeout_s: float) -> list[Shard]:
    """Poll (interval ``poll_interval_s`` +-20 %) until shards arrive or ``timeout_s`` passes."""
    deadline = time.monotonic() + timeout_s
    while True:
        shards = spool.claim_shards(consumer_id, max_shards, if_changed=True)
        if shards:
            return shards
        left = deadline - time.monotonic()
        if left <= 0:
            return []
        time.sleep(min(left, spool.config.poll_interval_s * random.uniform(0.8, 1.2)))


# ------------------------------------------------------------------------------------ workers


def claim_worker(run: str, worker_id: str, out: str, config: SpoolConfig) -> None:
    """Claim and finish tasks until the queue is empty; write the ids claimed to ``out``."""
    spool = Spool(run, config)
    claimed: list[str] = []
    not_finished: list[str] = []
    while True:
        lease = spool.claim_task(worker_id)
        if lease is None:
            if not spool.tasks.counts()["tasks_ready"]:
                break
            continue
        claimed.append(lease.task_id)
        if not spool.finish_task(lease):
            not_finished.append(lease.task_id)
    write_json(Path(out), {"claimed": claimed, "not_finished": not_finished})


def stopped_worker(run: str, worker_id: str, config: SpoolConfig) -> None:
    """Claim one task, stop itself (the test resumes it past the lease), then deliver and finish."""
    spool = Spool(run, config)
    lease = spool.claim_task(worker_id)
    assert lease is not None
    os.kill(os.getpid(), signal.SIGSTOP)
    with spool.writer(worker_id) as writer:
        writer.add_group(make_group(lease.task_id, 4, attempt=lease.attempt, tag="-late"))
    finished = spool.finish_task(lease)
    write_json(Path(run) / f"{worker_id}.json", {"finished": finished, "attempt": lease.attempt})


def shard_writer(run: str, worker_id: str, first: int, groups: int, config: SpoolConfig) -> None:
    """Write ``groups`` groups of 3; log each published shard with its trajectory ids."""
    spool = Spool(run, config)
    log = Path(run) / f"writer-{worker_id}.log"
    with spool.writer(worker_id) as writer:
        for g in range(first, first + groups):
            before = len(writer.published)
            writer.add_group(make_group(f"task-{worker_id}-{g}", 3))
            for shard_id in writer.published[before:]:
                with open(log, "a") as f:
                    f.write(shard_id + "\n")


def consumer(run: str, consumer_id: str, config: SpoolConfig, rounds: int) -> None:
    """A trainer: fence, recover from its checkpoint, then claim -> 'train' -> checkpoint -> commit."""
    spool = Spool(run, config)
    ckpt = Path(run) / "checkpoint.json"
    spool.fence(consumer_id)
    covered = json.loads(ckpt.read_text())["shards"] if ckpt.exists() else []
    spool.recover(consumer_id, covered)
    for _ in range(rounds):
        shards = spool.claim_shards(consumer_id, 2)
        if not shards:
            time.sleep(0.005)
            continue
        trained = [t.trajectory_id for s in shards for t in s.trajectories()]
        assert trained is not None
        covered = covered + [s.shard_id for s in shards]
        write_json(ckpt, {"shards": covered})
        spool.commit(consumer_id, [s.shard_id for s in shards])
