"""The :class:`Spool` object: the task queue, the shard queue and the fence of one run, composed.

It implements both faces of :mod:`hpc.spool.faces` by delegating to its parts (a
:class:`~hpc.spool.lease.TaskQueue`, a :class:`~hpc.spool.shards.ShardQueue`, a
:class:`~hpc.spool.fencing.Fencing`); the roles hold it as the face they need. A Spool object
belongs to one process; only ``heartbeat`` may run in another thread.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from hpc.config.spool import SpoolConfig
from hpc.fsutil import fs_error, listdir, safe_name, visible
from hpc.paths import RunPaths
from hpc.shard import ShardWriter
from hpc.spool.fencing import Fencing
from hpc.spool.lease import Heartbeat, TaskLease, TaskQueue
from hpc.spool.shards import Shard, ShardQueue


class Spool:
    """The run's spool (see :mod:`hpc.spool` for the layout, the guarantees and who calls what)."""

    def __init__(self, run_dir: str | os.PathLike[str], config: SpoolConfig | None = None) -> None:
        self.paths = RunPaths(Path(run_dir))
        self.config = config or SpoolConfig()
        root = self.paths.spool
        self.heartbeat_dir = root / "heartbeats"
        shards = root / "shards"
        self.ready, self.claimed = shards / "ready", shards / "claimed"
        self.committed, self.quarantine = shards / "committed", shards / "quarantine"
        self.commits, self.dropped_dir = shards / "commits", root / "dropped"
        self.fence_dir = self.paths.control / "fence"
        if not self.fence_dir.is_dir():  # created last: one stat when the spool exists already
            tasks = root / "tasks"
            try:
                for d in (tasks / "ready", tasks / "claimed", tasks / "done", self.heartbeat_dir, self.ready,
                          self.claimed, self.committed, self.quarantine, self.commits, self.dropped_dir,
                          self.fence_dir):
                    d.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise fs_error(exc, root, "creating the spool") from exc
        self.tasks = TaskQueue(root / "tasks", self.heartbeat_dir, self.config.lease_s,
                               reap_interval_s=max(1.0, self.config.lease_s / 4))
        self.fencing = Fencing(self.fence_dir)
        self.shards = ShardQueue(shards, self.config, self.fencing)
        self._heartbeats: dict[str, Heartbeat] = {}
        self._last_beat: dict[str, float] = {}  # worker -> time.monotonic() of its last beat here

    # =========================================================================== rollout face
    def claim_task(self, worker_id: str) -> TaskLease | None:
        """Claim one ready task (None when none is ready); also reclaims leases of dead workers."""
        last = self._last_beat.get(worker_id)
        if last is None or time.monotonic() - last > self.config.heartbeat_interval_s / 2:
            self.heartbeat(worker_id)  # claiming shows life; more often would only cost I/O
        lease = self.tasks.claim(worker_id, self.config.lease_s)
        # every claim watches for dead workers, not only one that finds the queue dry: their tasks come back
        # about one lease after the death, not one lease after the queue first runs dry (a step waits on them)
        if self.tasks.maybe_reclaim() and lease is None:
            lease = self.tasks.claim(worker_id, self.config.lease_s)
        return lease

    def heartbeat(self, worker_id: str) -> None:
        """Show that ``worker_id`` lives (for ``lease_s``): call at least every ``heartbeat_interval_s``.

        Beating also watches for dead workers (at most about every lease/4), so a node that may not claim
        now (no inference server, backpressure) still runs the lease clock on them: their tasks go back to
        ``ready/`` one lease after the death, not one lease after this node's next claim."""
        hb = self._heartbeats.get(worker_id)
        if hb is None:
            hb = self._heartbeats[worker_id] = Heartbeat(self.heartbeat_dir, worker_id)
        hb.beat(self.config.lease_s)
        self._last_beat[worker_id] = time.monotonic()
        self.tasks.maybe_reclaim()

    def writer(self, worker_id: str) -> ShardWriter:
        """A context manager with ``add(traj)``/``add_group(trajs)``; publishes sealed shards."""
        return self.shards.writer(worker_id)

    def finish_task(self, lease: TaskLease) -> bool:
        """Mark the task done; False if the lease had expired and was reclaimed (result is a duplicate)."""
        return self.tasks.finish(lease)

    def release_task(self, lease: TaskLease) -> bool:
        """Give the task back to ready (next attempt); False if the lease was already reclaimed."""
        return self.tasks.release(lease)

    def pending_work(self) -> int:
        """Backpressure: shards published and not yet claimed by a consumer."""
        return self.shards.pending_work()

    def task_counts(self) -> dict[str, int]:
        """``tasks_ready``, ``tasks_claimed``, ``tasks_done``."""
        return self.tasks.counts()

    # =========================================================================== consumer face
    def fence(self, consumer_id: str) -> int:
        """Become the newest consumer generation; older ones can no longer commit. Returns it."""
        return self.fencing.fence(consumer_id)

    def check_fence(self, consumer_id: str) -> int:
        """The generation ``consumer_id`` holds; FencedError when a newer one exists."""
        return self.fencing.check(consumer_id)

    def recover(self, consumer_id: str, committed_shard_ids: Iterable[str], checkpoint: str = "") -> dict[str, int]:
        """After a restart: commit what the latest checkpoint covers, return the rest to ready, and
        remove dead writers' temporaries. Handles this consumer's claims from every generation and
        any consumer's claims from older generations. Returns ``{"committed": n, "returned": m}``."""
        out = self.shards.recover(consumer_id, committed_shard_ids, checkpoint)
        self._clean_temporaries()
        return out

    def uncommit(self, consumer_id: str, checkpoints: Iterable[str]) -> int:
        """Return to ready the shards committed after ``checkpoints`` (torn, left out of the lineage);
        their commit records are voided (renamed ``.voided-...``, kept for the record). Returns #shards."""
        return self.shards.uncommit(consumer_id, checkpoints)

    def claim_shards(self, consumer_id: str, max_shards: int, *, if_changed: bool = False) -> list[Shard]:
        """Claim up to ``max_shards`` ready shards in arrival order (:mod:`hpc.arrival`: the order this
        object first listed them, never the writers' clocks); corrupt ones are quarantined.

        ``if_changed=True`` (for polling loops): one ``stat`` instead of a listing while ``ready/``
        has not changed. Raises FencedError for a consumer of an older generation.
        """
        return self.shards.claim(consumer_id, max_shards, if_changed=if_changed)

    def commit(self, consumer_id: str, shard_ids: Sequence[str], checkpoint: str = "") -> int:
        """Mark claimed shards as trained (after ``checkpoint``, which covers them). Returns #committed.

        Raises FencedError if a newer consumer generation exists.
        """
        return self.shards.commit(consumer_id, shard_ids, checkpoint)

    def put_tasks(self, tasks: Iterable[Mapping[str, Any]]) -> int:
        """Add tasks (each with a deterministic ``task_id``); ids seen before are skipped. Returns #added."""
        return self.tasks.put(tasks)

    def open_tasks(self, task_ids: Iterable[str]) -> set[str]:
        """The subset of ``task_ids`` that is ready or claimed (not finished, not lost)."""
        names = self.tasks.open_names()
        return {t for t in task_ids if safe_name(t) in names}

    def reissue_task(self, task: Mapping[str, Any]) -> str:
        """Run a finished task again whose results were lost (see :meth:`TaskQueue.reissue`)."""
        return self.tasks.reissue(task)

    def unconsumed_shards(self, consumer_id: str) -> set[str]:
        """Shard names this consumer has not taken in yet: ready, or claimed by another generation."""
        return self.shards.unconsumed(consumer_id)

    def task_holders(self) -> dict[str, str]:
        """Claimed task -> the worker holding its claim, both as their file names (:func:`safe_name`)."""
        return self.tasks.holders()

    # =========================================================================== operators
    def stats(self) -> dict[str, int]:
        """Counts by state: tasks, shards, trajectories (from shard ids), drops, temporaries."""
        shards = self.shards.counts()
        tmp_files = shards.pop("tmp_files")
        out = {**self.tasks.counts(), **shards}
        out["trajectories_dropped_other"] = sum(len(r.get("trajectories", [])) for r in self._drop_records())
        out["tmp_files"] = tmp_files
        out["generation"] = self.fencing.current()
        out["corrupt_detected_here"] = self.shards.corrupt_detected
        return out

    def _clean_temporaries(self) -> int:
        dirs = [self.ready, self.tasks.ready, self.commits, self.dropped_dir, self.fence_dir, self.quarantine]
        return sum(self.shards.clean(d) for d in dirs)

    def _drop_records(self) -> Iterator[dict[str, Any]]:
        for name in visible(listdir(self.dropped_dir)):
            try:
                yield json.loads((self.dropped_dir / name).read_bytes())
            except (OSError, ValueError):
                continue
