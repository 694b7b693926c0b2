"""The spool: a task queue and a trajectory-shard queue on a shared filesystem, with no server.

Layout under ``RUN/spool/`` (``RUN/control/fence/`` holds the consumer generations)::

    tasks/ready/<task>@<attempt>        tasks/claimed/<worker>/<task>@<attempt>     tasks/done/<task>@<attempt>
    heartbeats/<worker>                 (a counter that changes while the worker lives)
    shards/ready/<shard>.shard          shards/claimed/<consumer>@g<generation>/<shard>.shard
    shards/committed/<shard>.shard      shards/quarantine/<shard>.shard (+ .reason.json)
    shards/commits/<generation>-....json  (what each commit covered, and which rows it dropped)
    dropped/<...>.json                  (trajectories dropped elsewhere, with the reason)

Guarantees (mechanisms: temp + fsync + rename; claim by rename; heartbeat counters judged on the
reader's own monotonic clock; never flock/fcntl, inotify or sub-second mtimes):

- Each task and each shard goes to exactly one claimer (see :mod:`hpc.lease`, :mod:`hpc.shard`).
- Exactly once into the model: a trainer claims shards, trains, checkpoints the shard ids, then
  ``commit``s. After a crash, ``fence`` + ``recover(consumer, ids_in_latest_checkpoint)`` commits
  those and returns every other claimed shard to ``ready/``. A stale trainer (older generation)
  gets :class:`FencedError` from ``commit``/``recover``. Shard claims are never reclaimed by
  lease: a trainer may legitimately hold shards through a long step, only its successor frees them.
  Generations live in :mod:`hpc.fencing`; ``check_fence`` lets the trainer refuse its own writes.
- Each commit record names the checkpoint that covers it; when a resume finds that checkpoint torn
  and falls back past it, ``uncommit`` returns its shards to ready and voids the record, so what
  it trained is trained again in the surviving lineage (never lost, never twice in it).
- Deduplication by task id: the first writer session (and attempt) that delivers a task id owns
  it; rows of that task from any other shard are dropped with reason ``duplicate_task`` and the
  drop is written into the commit record. This absorbs the late result of a worker that was
  stopped past its lease (its ``finish_task`` also answers False). The owners are rebuilt from the
  commit records, so the rule survives trainer restarts. One consumer generation should claim
  through one Spool object (rank 0), which is how the trainer uses it.
- A corrupt or truncated shard is moved to ``quarantine/`` with a reason and counted; the reader
  carries on. Every trajectory ends committed (trained), dropped with a reason, quarantined, or
  still queued: :meth:`Spool.stats` counts each.
- Shards are claimed in the order the consumer first listed them (:mod:`hpc.arrival`), never by
  the writer's wall-clock time that opens each shard id: a skewed clock neither jumps nor starves.
- Idle polling (:meth:`Spool.wait_for_shards`, or ``claim_shards(..., if_changed=True)``) costs
  one ``stat`` of ``shards/ready`` per poll; it lists only when the directory's attributes changed
  (and once more a few seconds later, so a coarse timestamp never hides a shard). On NFS the
  client's directory attribute cache (acdirmin/acdirmax) delays what any poll can see; mount the
  run directory with a small one (e.g. ``actimeo=1``) for a quick hand-over.

Who does what: rollout workers ``claim_task`` -> ``keepalive``/``heartbeat`` -> ``writer().add_group``
-> ``finish_task`` (False = the lease was lost: the result is deduplicated, never trained twice),
and check ``backpressure()`` before claiming. The trainer ``fence``s, ``recover``s, polls with
``wait_for_shards`` (or ``claim_shards(..., if_changed=True)``), ``commit``s after each checkpoint,
and calls ``reclaim_expired`` now and then (idle workers also reclaim, at most every lease/4).
A Spool object belongs to one process; only ``heartbeat``/``keepalive`` may run in a thread.
Known limit: a fenced trainer that passed its fence check just before a newer one fenced can
still commit the shards it holds (no lock spans check and rename on these filesystems); the
newer trainer then never sees them as ready, so they are trained by the stale one only.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import socket
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from hpc.arrival import SETTLE_S, ReadyWatch
from hpc.config.spool import SpoolConfig
from hpc.errors import CorruptShardError, SpoolError
from hpc.fencing import Fencing
from hpc.fsutil import (
    TMP_PREFIX,
    TmpCleaner,
    atomic_write_json,
    fs_error,
    listdir,
    publish_file,
    safe_name,
    try_rename,
    visible,
)
from hpc.lease import Heartbeat, TaskLease, TaskQueue
from hpc.paths import RunPaths
from hpc.shard import (
    SUFFIX,
    ShardWriter,
    decode_table,
    read_shard_bytes,
    shard_count,
    table_trajectories,
    writer_session,
)
from hpc.trajectory import Trajectory

__all__ = ["SETTLE_S", "Shard", "Spool", "TaskLease"]



class Shard:
    """A claimed, verified shard. ``trajectories()`` yields its rows minus duplicates of other shards."""

    def __init__(self, shard_id: str, path: Path, table: pa.Table, keep: list[int], info: dict[str, Any]):
        self.shard_id = shard_id
        self.path = path
        self.table = table
        self.keep = keep
        self.info = info  # what the commit record says about it: owners, dropped rows, count

    @property
    def dropped(self) -> list[dict[str, str]]:
        return list(self.info["dropped"])

    def __len__(self) -> int:
        return len(self.keep)

    def trajectories(self) -> Iterator[Trajectory]:
        return table_trajectories(self.table, str(self.path), self.keep)


class Spool(Fencing):
    """Facade over the run's spool (see the module docstring for layout and guarantees)."""

    def __init__(self, run_dir: str | os.PathLike[str], config: SpoolConfig | None = None) -> None:
        self.paths = RunPaths(Path(run_dir))
        self.config = config or SpoolConfig()
        root = self.paths.spool
        self.heartbeat_dir = root / "heartbeats"
        self.shards = root / "shards"
        self.ready, self.claimed = self.shards / "ready", self.shards / "claimed"
        self.committed, self.quarantine = self.shards / "committed", self.shards / "quarantine"
        self.commits, self.dropped_dir = self.shards / "commits", root / "dropped"
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
        self._heartbeats: dict[str, Heartbeat] = {}
        self._last_beat: dict[str, tuple[float, float]] = {}
        self._generation: dict[str, int] = {}
        self._owners: dict[str, str] | None = None  # task_id -> "writer session#attempt" that owns it
        self._watch = ReadyWatch(self.ready)
        self._cleaner = TmpCleaner(self.config.lease_s)
        self._made: set[Path] = set()
        self._next_sweep = 0.0
        self._infos: dict[str, dict[str, Any]] = {}  # claimed here, not yet committed
        self.corrupt_detected = 0

    # =========================================================================== tasks
    def put_tasks(self, tasks: Iterable[Mapping[str, Any]]) -> int:
        """Add tasks (each with a deterministic ``task_id``); ids seen before are skipped. Returns #added."""
        return self.tasks.put(tasks)

    def claim_task(self, worker_id: str, lease_s: float | None = None) -> TaskLease | None:
        """Claim one ready task (None when none is ready); also reclaims leases of dead workers."""
        lease_s = float(lease_s or self.config.lease_s)
        last = self._last_beat.get(worker_id)
        if last is None or last[1] != lease_s or time.monotonic() - last[0] > self.config.heartbeat_interval_s / 2:
            self.heartbeat(worker_id, lease_s=lease_s)  # claiming shows life; more often would only cost I/O
        lease = self.tasks.claim(worker_id, lease_s)
        if lease is None and self.tasks.maybe_reclaim():
            lease = self.tasks.claim(worker_id, lease_s)
        return lease

    def finish_task(self, lease: TaskLease) -> bool:
        """Mark the task done; False if the lease had expired and was reclaimed (result is a duplicate)."""
        return self.tasks.finish(lease)

    def release_task(self, lease: TaskLease) -> bool:
        """Give the task back to ready (next attempt); False if the lease was already reclaimed."""
        return self.tasks.release(lease)

    def open_tasks(self, task_ids: Iterable[str]) -> set[str]:
        """The subset of ``task_ids`` that is ready or claimed (not finished, not lost)."""
        names = self.tasks.open_names()
        return {t for t in task_ids if safe_name(t) in names}

    def task_holders(self) -> dict[str, str]:
        """Claimed task -> the worker holding its claim, both as their file names (:func:`safe_name`)."""
        return self.tasks.holders()

    def reissue_task(self, task: Mapping[str, Any]) -> str:
        """Run a finished task again whose results were lost (see :meth:`TaskQueue.reissue`)."""
        return self.tasks.reissue(task)

    def heartbeat(self, worker_id: str, *, lease_s: float | None = None) -> None:
        """Show that ``worker_id`` lives: call at least every ``heartbeat_interval_s``."""
        hb = self._heartbeats.get(worker_id)
        if hb is None:
            hb = self._heartbeats[worker_id] = Heartbeat(self.heartbeat_dir, worker_id)
        lease_s = float(lease_s or self.config.lease_s)
        hb.beat(lease_s)
        self._last_beat[worker_id] = (time.monotonic(), lease_s)

    @contextlib.contextmanager
    def keepalive(self, worker_id: str) -> Iterator[None]:
        """Heartbeat ``worker_id`` every ``heartbeat_interval_s`` from a thread while the block runs.

        A stopped or killed process stops beating with it, so its leases expire as they should.
        """
        stop = threading.Event()

        def beat() -> None:
            while not stop.wait(self.config.heartbeat_interval_s):
                with contextlib.suppress(SpoolError):
                    self.heartbeat(worker_id, lease_s=self._last_beat.get(worker_id, (0.0, None))[1])

        self.heartbeat(worker_id)
        thread = threading.Thread(target=beat, name=f"heartbeat-{worker_id}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def reclaim_expired(self) -> int:
        """Return the tasks of workers whose heartbeat stopped for a lease to ready; returns how many."""
        return self.tasks.reclaim_expired()

    # =========================================================================== writing
    def writer(self, worker_id: str) -> ShardWriter:
        """A context manager with ``add(traj)``/``add_group(trajs)``; publishes sealed shards."""
        return ShardWriter(self.ready, worker_id, self.config)

    def pending_work(self) -> int:
        """Backpressure: shards published and not yet claimed by a consumer."""
        return sum(1 for n in visible(listdir(self.ready)) if n.endswith(SUFFIX))

    def unconsumed_shards(self, consumer_id: str) -> set[str]:
        """Shard names this consumer has not taken in yet: ready, or claimed by another generation."""
        mine = self.claimed / f"{safe_name(consumer_id)}@g{self._my_generation(consumer_id)}"
        names = set(visible(listdir(self.ready)))
        for d in visible(listdir(self.claimed)):
            if self.claimed / d != mine:
                names.update(visible(listdir(self.claimed / d)))
        return {n for n in names if n.endswith(SUFFIX)}

    def backpressure(self) -> bool:
        """True while rollout nodes should stop claiming tasks (too much unconsumed work)."""
        return self.pending_work() >= self.config.max_ready_shards

    def drop(self, trajectories: Sequence[Trajectory], reason: str, process: str) -> None:
        """Record trajectories dropped outside the spool (e.g. too stale) so each is accounted for."""
        rows = [{"trajectory_id": t.trajectory_id, "task_id": t.task_id, "reason": reason} for t in trajectories]
        record = {"process": process, "reason": reason, "t": time.time(), "trajectories": rows}
        name = f"{int(time.time() * 1000):013d}-{safe_name(process)}-{secrets.token_hex(4)}.json"
        publish_file(self.dropped_dir / name, json.dumps(record).encode())

    # =========================================================================== consuming
    def claim_shards(self, consumer_id: str, max_shards: int, *, if_changed: bool = False) -> list[Shard]:
        """Claim up to ``max_shards`` ready shards in arrival order (:mod:`hpc.arrival`: the order this
        object first listed them, never the writers' clocks); corrupt ones are quarantined.

        ``if_changed=True`` (for polling loops): one ``stat`` instead of a listing while ``ready/``
        has not changed. Raises FencedError for a consumer of an older generation.
        """
        self._maybe_sweep(consumer_id)
        if if_changed and not self._watch.changed():
            return []
        listing = listdir(self.ready)
        self._clean_tmp(listing)
        names = self._watch.order(n for n in visible(listing) if n.endswith(SUFFIX))
        if not names or max_shards <= 0:
            return []
        self._check_fence(consumer_id)
        mine = self._claim_dir(consumer_id)
        out: list[Shard] = []
        for name in names:
            if len(out) >= max_shards:
                break
            if try_rename(self.ready / name, mine / name):
                shard = self._open(consumer_id, mine / name)
                if shard is not None:
                    out.append(shard)
        return out

    def wait_for_shards(self, consumer_id: str, max_shards: int, timeout_s: float) -> list[Shard]:
        """Poll (interval ``poll_interval_s`` +-20 %) until shards arrive or ``timeout_s`` passes."""
        deadline = time.monotonic() + timeout_s
        while True:
            shards = self.claim_shards(consumer_id, max_shards, if_changed=True)
            if shards:
                return shards
            left = deadline - time.monotonic()
            if left <= 0:
                return []
            time.sleep(min(left, self.config.poll_interval_s * random.uniform(0.8, 1.2)))

    def _claim_dir(self, consumer_id: str) -> Path:
        path = self.claimed / f"{safe_name(consumer_id)}@g{self._my_generation(consumer_id)}"
        if path not in self._made:
            path.mkdir(exist_ok=True)
            self._made.add(path)
        return path

    def _open(self, consumer_id: str, path: Path) -> Shard | None:
        shard_id = path.name[: -len(SUFFIX)]
        try:
            table = decode_table(read_shard_bytes(path), str(path))
        except CorruptShardError as exc:
            self._quarantine(path, str(exc), consumer_id)
            return None
        except OSError as exc:  # an I/O error on the file itself: set aside like corruption, keep going
            self._quarantine(path, f"{path}: unreadable: {exc}", consumer_id)
            return None
        keep, info = self._dedup(shard_id, table)
        self._infos[shard_id] = info
        return Shard(shard_id, path, table, keep, info)

    def _quarantine(self, path: Path, reason: str, consumer_id: str) -> None:
        self.corrupt_detected += 1
        target = self.quarantine / path.name
        if try_rename(path, target):
            record = {"reason": reason, "consumer": consumer_id, "host": socket.gethostname(), "t": time.time()}
            atomic_write_json(self.quarantine / f"{path.name}.reason.json", record)

    # -- deduplication by task id -----------------------------------------------------------------
    def _dedup(self, shard_id: str, table: pa.Table) -> tuple[list[int], dict[str, Any]]:
        """Rows to train and the commit-record info: first delivery (writer session, attempt) wins."""
        owners = self._load_owners()
        session = writer_session(table)
        keep: list[int] = []
        dropped: list[dict[str, str]] = []
        mine: dict[str, str] = {}
        columns = [table.column(c).to_pylist() for c in ("task_id", "attempt", "trajectory_id")]
        for i, (task_id, attempt, traj_id) in enumerate(zip(*columns, strict=True)):
            key = f"{session}#{attempt}"
            if owners.setdefault(task_id, key) == key:
                keep.append(i)
                mine[task_id] = key
            else:
                dropped.append({"trajectory_id": traj_id, "task_id": task_id, "reason": "duplicate_task"})
        return keep, {"owners": mine, "dropped": dropped, "count": table.num_rows}

    def _load_owners(self) -> dict[str, str]:
        if self._owners is None:
            owners: dict[str, str] = {}
            for record in self._commit_records():
                for info in record.get("shards", {}).values():
                    for task_id, key in info.get("owners", {}).items():
                        owners.setdefault(task_id, key)
            self._owners = owners
        return self._owners

    def _commit_records(self) -> Iterator[dict[str, Any]]:
        for name in sorted(visible(listdir(self.commits))):
            try:
                yield json.loads((self.commits / name).read_bytes())
            except (OSError, ValueError):
                continue

    # =========================================================================== commit / fence
    def commit(self, consumer_id: str, shard_ids: Sequence[str], checkpoint: str = "") -> int:
        """Mark claimed shards as trained (after ``checkpoint``, which covers them). Returns #committed.

        Raises FencedError if a newer consumer generation exists.
        """
        generation = self._check_fence(consumer_id)
        mine = self._claim_dir(consumer_id)
        done = [sid for sid in shard_ids if try_rename(mine / f"{sid}{SUFFIX}", self.committed / f"{sid}{SUFFIX}")]
        if done:
            self._write_commit_record(consumer_id, generation, {sid: self._shard_info(sid) for sid in done},
                                      checkpoint)
        return len(done)

    def _shard_info(self, shard_id: str) -> dict[str, Any]:
        info = self._infos.pop(shard_id, None)
        if info is None:  # claimed before a restart: recompute (same deterministic rule, shard order)
            try:
                table = decode_table(read_shard_bytes(self.committed / f"{shard_id}{SUFFIX}"), shard_id)
                info = self._dedup(shard_id, table)[1]
            except (CorruptShardError, OSError) as exc:
                info = {"owners": {}, "dropped": [], "count": shard_count(shard_id), "error": str(exc)}
        return info

    def _write_commit_record(self, consumer_id: str, generation: int, shards: dict[str, Any],
                             checkpoint: str = "") -> None:
        record = {"consumer": consumer_id, "generation": generation, "t": time.time(), "shards": shards,
                  "checkpoint": checkpoint}
        name = f"{generation:08d}-{int(time.time() * 1000):013d}-{secrets.token_hex(4)}.json"
        publish_file(self.commits / name, json.dumps(record).encode(), replace=True)  # a unique name

    def uncommit(self, consumer_id: str, checkpoints: Iterable[str]) -> int:
        """Return to ready the shards committed after ``checkpoints`` (torn, left out of the lineage);
        their commit records are voided (renamed ``.voided-...``, kept for the record). Returns #shards."""
        self._check_fence(consumer_id)
        tags, moved = set(checkpoints), 0
        for name in sorted(visible(listdir(self.commits))):
            try:
                record = json.loads((self.commits / name).read_bytes())
            except (OSError, ValueError):
                continue
            if record.get("checkpoint") in tags:
                for sid in record.get("shards", {}):
                    moved += try_rename(self.committed / f"{sid}{SUFFIX}", self.ready / f"{sid}{SUFFIX}",
                                        check_dst=False)
                try_rename(self.commits / name, self.commits / f".voided-{name}", check_dst=False)
        self._owners = None
        return moved

    def recover(self, consumer_id: str, committed_shard_ids: Iterable[str], checkpoint: str = "") -> dict[str, int]:
        """After a restart: commit what the latest checkpoint covers, return the rest to ready.

        Handles this consumer's claims from every generation and any consumer's claims from older
        generations. Returns ``{"committed": n, "returned": m}``.
        """
        generation = self._check_fence(consumer_id)
        covered = set(committed_shard_ids)
        self._owners, self._infos = None, {}  # rebuilt from the commit records, then in shard order
        out = {"committed": 0, "returned": 0}
        committed: list[str] = []
        for directory in self._stale_claim_dirs(consumer_id, generation):
            for name in sorted(visible(listdir(directory))):
                sid = name[: -len(SUFFIX)]
                if sid in covered and try_rename(directory / name, self.committed / name):
                    committed.append(sid)
                elif sid not in covered and try_rename(directory / name, self.ready / name):
                    out["returned"] += 1
        if committed:
            infos = {sid: self._shard_info(sid) for sid in sorted(committed)}
            self._write_commit_record(consumer_id, generation, infos, checkpoint)
        out["committed"] = len(committed)
        self.clean_temporaries()
        return out

    def _maybe_sweep(self, consumer_id: str) -> None:
        """Now and then, the current consumer returns shards that stale generations claimed after
        its ``recover`` (a fenced trainer that still ran for a while) to ready."""
        generation = self._my_generation(consumer_id)
        if not generation or time.monotonic() < self._next_sweep:
            return
        self._next_sweep = time.monotonic() + max(1.0, self.config.lease_s / 4)
        for directory in self._stale_claim_dirs(consumer_id, generation, include_own=False):
            for name in visible(listdir(directory)):
                try_rename(directory / name, self.ready / name, check_dst=False)

    def _stale_claim_dirs(self, consumer_id: str, generation: int, include_own: bool = True) -> list[Path]:
        me = safe_name(consumer_id)
        out = []
        for name in visible(listdir(self.claimed)):
            who, _, gen = name.rpartition("@g")
            if not gen.isdigit():
                continue
            if (include_own and who == me) or int(gen) < generation:
                out.append(self.claimed / name)
        return out

    # =========================================================================== housekeeping
    def _clean_tmp(self, names: Sequence[str]) -> int:
        return self._cleaner.clean(self.ready, names)

    def clean_temporaries(self) -> int:
        """Remove temporaries of dead writers everywhere in the spool (run at trainer start)."""
        dirs = [self.ready, self.tasks.ready, self.commits, self.dropped_dir, self.fence_dir, self.quarantine]
        return sum(self._cleaner.clean(d, listdir(d)) for d in dirs)

    def stats(self) -> dict[str, int]:
        """Counts by state: tasks, shards, trajectories (from shard ids), drops, temporaries."""
        out = dict(self.tasks.counts())
        ready_all = listdir(self.ready)
        groups = {"ready": [n for n in visible(ready_all) if n.endswith(SUFFIX)],
                  "claimed": [n for d in visible(listdir(self.claimed)) for n in visible(listdir(self.claimed / d))],
                  "committed": visible(listdir(self.committed)),
                  "quarantined": [n for n in visible(listdir(self.quarantine)) if n.endswith(SUFFIX)]}
        for state, names in groups.items():
            out[f"shards_{state}"] = len(names)
            out[f"trajectories_{state}"] = sum(shard_count(n[: -len(SUFFIX)]) for n in names)
        dropped = {sid: len(info.get("dropped", [])) for r in self._commit_records()
                   for sid, info in r.get("shards", {}).items()}  # a shard recorded twice counts once
        out["trajectories_dropped_duplicate"] = sum(dropped.values())
        out["trajectories_dropped_other"] = sum(len(r.get("trajectories", [])) for r in self._drop_records())
        out["tmp_files"] = sum(1 for n in ready_all if n.startswith(TMP_PREFIX))
        out["generation"] = self.current_generation()
        out["corrupt_detected_here"] = self.corrupt_detected
        return out

    def _drop_records(self) -> Iterator[dict[str, Any]]:
        for name in visible(listdir(self.dropped_dir)):
            try:
                yield json.loads((self.dropped_dir / name).read_bytes())
            except (OSError, ValueError):
                continue
