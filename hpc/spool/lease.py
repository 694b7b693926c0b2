"""Task leases on a shared filesystem: claim by rename, liveness by heartbeat counters.

Guarantees (each holds on NFS, Lustre and GPFS; no flock/fcntl, no inotify, no mtimes):

- A task file lives in exactly one place: ``ready/``, ``claimed/<worker>/`` or ``done/``. Moving it
  is a ``rename``, so of several claimers exactly one wins. After an error on rename the claimer
  looks into its own claim directory before concluding it lost (an NFS retry of a rename that
  already happened answers ENOENT).
- A file name is ``<task>@<attempt>``: the attempt is the lease's epoch. Finishing or releasing a
  lease renames exactly that name, so a lease that was reclaimed in the meantime (its holder was
  stopped past its lease) can no longer finish: :meth:`TaskQueue.finish` answers False.
- ``put`` is idempotent per task id: ids already ready, claimed or done (``done/<task>@<attempt>``
  is kept forever) are skipped, and the final link refuses to replace an existing file.
- ``reissue`` runs a finished task again whose results were lost (its shard quarantined): done
  goes back to ready with the attempt bumped; a task file that vanished is put again.
- A worker is alive while its heartbeat counter file changes, as observed on the *observer's own*
  ``time.monotonic()``; a worker whose counter has not changed for its lease (written into the
  heartbeat file) is expired and its claims go back to ``ready/`` with the attempt bumped. Every
  claim through the spool watches (at most about every lease/4), ready tasks or not, and the
  reclaimer's next claims take what it moved back first.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import secrets
import time
from collections.abc import Container, Iterable, Mapping
from pathlib import Path
from typing import Any

from hpc.errors import SpoolError
from hpc.fsutil import listdir, publish_new_files, safe_name, try_rename, visible

# ---------------------------------------------------------------------------------------------
# Heartbeats


class Heartbeat:
    """Writes ``heartbeats/<worker>``: a counter that changes on every beat, plus the lease length."""

    def __init__(self, directory: Path, worker_id: str) -> None:
        self.path = directory / safe_name(worker_id)
        self._token = secrets.token_hex(4)  # a restarted worker never repeats an old value
        self._count = 0

    def beat(self, lease_s: float) -> None:
        self._count += 1
        text = f"{self._token}-{self._count} {lease_s:.3f}\n".ljust(48).encode()
        try:
            # In place (no create/rename): a heartbeat costs no metadata-changing operation.
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                os.pwrite(fd, text, 0)
            finally:
                os.close(fd)
        except OSError as exc:
            raise SpoolError(f"cannot write heartbeat {self.path}: {exc}") from exc


def read_heartbeat(path: Path) -> tuple[str, float] | None:
    """(counter, lease_s) from a heartbeat file, or None when absent or unreadable."""
    try:
        parts = path.read_text().split()
        return parts[0], float(parts[1])
    except (OSError, IndexError, ValueError):
        return None


class Liveness:
    """Judges workers alive or expired from their heartbeat counters, on this process's clock.

    A worker is expired when its counter (or its absence) has stayed the same for longer than its
    lease, measured from when *this* observer first saw that value. A fresh observer therefore
    waits a full lease before reclaiming anything: never early, at worst one lease late.
    """

    def __init__(self, directory: Path, default_lease_s: float) -> None:
        self.directory = directory
        self.default_lease_s = default_lease_s
        self._seen: dict[str, tuple[str | None, float]] = {}

    def expired(self, worker_name: str) -> bool:
        hb = read_heartbeat(self.directory / worker_name)
        value, lease_s = (hb[0], hb[1]) if hb else (None, self.default_lease_s)
        now = time.monotonic()
        last = self._seen.get(worker_name)
        if last is None or last[0] != value:
            self._seen[worker_name] = (value, now)
            return False
        return now - last[1] > lease_s


# ---------------------------------------------------------------------------------------------
# Tasks


@dataclasses.dataclass(frozen=True)
class TaskLease:
    """A claimed task. ``attempt`` is the lease epoch: it grows each time the task is reclaimed."""

    task_id: str
    task: Mapping[str, Any]
    worker_id: str
    attempt: int
    path: Path
    lease_s: float


def _split(file_name: str) -> tuple[str, int]:
    name, _, attempt = file_name.rpartition("@")
    return name, int(attempt)


class TaskQueue:
    """The task side of the spool: ``tasks/{ready,claimed/<worker>,done}``."""

    def __init__(self, root: Path, heartbeats: Path, lease_s: float, reap_interval_s: float) -> None:
        self.ready, self.claimed, self.done = root / "ready", root / "claimed", root / "done"  # made by Spool
        self.heartbeats = heartbeats
        self.lease_s = lease_s
        self.reap_interval_s = reap_interval_s
        self.liveness = Liveness(heartbeats, lease_s)
        self._candidates: list[str] = []
        self._next_reap = 0.0
        self._made: set[str] = set()

    # -- put ------------------------------------------------------------------------------------
    def known_names(self) -> set[str]:
        """Every task name in any state. The order ready, claimed, done, ready again sees a task that
        moves during the listing (claim, finish, reclaim) in at least one of the listings."""
        names = {_split(n)[0] for n in visible(listdir(self.ready))}
        for worker in visible(listdir(self.claimed)):
            names.update(_split(n)[0] for n in visible(listdir(self.claimed / worker)))
        names.update(_split(n)[0] for n in visible(listdir(self.done)))
        names.update(_split(n)[0] for n in visible(listdir(self.ready)))
        return names

    def open_names(self) -> set[str]:
        """Names of the tasks ready or claimed (listed ready, claimed, ready: a task being claimed or
        reclaimed during the listing is seen in one of them)."""
        names = {_split(n)[0] for n in visible(listdir(self.ready))}
        for worker in visible(listdir(self.claimed)):
            names.update(_split(n)[0] for n in visible(listdir(self.claimed / worker)))
        names.update(_split(n)[0] for n in visible(listdir(self.ready)))
        return names

    def reissue(self, task: Mapping[str, Any]) -> str:
        """Run a finished task again: ``done/<task>@<a>`` goes back to ``ready/<task>@<a+1>``; a task
        found nowhere (its file lost to a read error) is put again. Returns 'reissued', 're-put' or
        'open' (it is ready or claimed already)."""
        name = safe_name(str(task["task_id"]))
        done = sorted((n for n in visible(listdir(self.done)) if _split(n)[0] == name), key=lambda n: _split(n)[1])
        if done:
            attempt = _split(done[-1])[1]
            if try_rename(self.done / done[-1], self.ready / f"{name}@{attempt + 1}", check_dst=False):
                return "reissued"
        if name in self.open_names():
            return "open"
        return "re-put" if self.put([task]) else "open"

    def put(self, tasks: Iterable[Mapping[str, Any]]) -> int:
        known = self.known_names()
        items: list[tuple[Path, bytes]] = []
        for task in tasks:
            task_id = task.get("task_id")
            if not isinstance(task_id, str) or not task_id:
                raise SpoolError(f"put_tasks: every task needs a non-empty string 'task_id', got {task_id!r}")
            name = safe_name(task_id)
            if name in known:
                continue
            known.add(name)
            items.append((self.ready / f"{name}@0", json.dumps(dict(task), sort_keys=True, default=str).encode()))
        return publish_new_files(items)

    # -- claim ----------------------------------------------------------------------------------
    def _worker_dir(self, worker_id: str) -> Path:
        path = self.claimed / safe_name(worker_id)
        if worker_id not in self._made:
            path.mkdir(exist_ok=True)
            self._made.add(worker_id)
        return path

    def claim(self, worker_id: str, lease_s: float) -> TaskLease | None:
        mine = self._worker_dir(worker_id)
        for _ in range(3):
            if not self._candidates:
                self._candidates = visible(listdir(self.ready))
                if not self._candidates:
                    return None
                random.shuffle(self._candidates)  # spread claimers over the queue: fewer collisions
            for _miss in range(32):
                if not self._candidates:
                    break
                file_name = self._candidates.pop()
                if try_rename(self.ready / file_name, mine / file_name):
                    lease = self._load(worker_id, mine / file_name, lease_s)
                    if lease is not None:
                        return lease
            else:
                self._candidates = []  # 32 misses in a row: our listing has gone stale
        return None

    def _load(self, worker_id: str, path: Path, lease_s: float) -> TaskLease | None:
        try:
            task = json.loads(path.read_bytes())
            task_id = str(task["task_id"])
        except (OSError, ValueError, KeyError, TypeError):
            path.unlink(missing_ok=True)  # unreadable: not a task anyone can run; a re-put adds it again
            return None
        name, attempt = _split(path.name)
        return TaskLease(task_id=task_id, task=task, worker_id=worker_id, attempt=attempt,
                         path=path, lease_s=lease_s)

    # -- end of a lease --------------------------------------------------------------------------
    def finish(self, lease: TaskLease) -> bool:
        """Mark done; False when the lease was reclaimed meanwhile (the late result is a duplicate)."""
        return try_rename(lease.path, self.done / lease.path.name)

    def release(self, lease: TaskLease) -> bool:
        name, attempt = _split(lease.path.name)
        return try_rename(lease.path, self.ready / f"{name}@{attempt + 1}", check_dst=False)

    # -- expiry ---------------------------------------------------------------------------------
    def maybe_reclaim(self) -> int:
        now = time.monotonic()
        if now < self._next_reap:
            return 0
        self._next_reap = now + self.reap_interval_s * random.uniform(0.8, 1.2)
        return self.reclaim_expired()

    def reclaim_expired(self, among: Container[str] | None = None) -> int:
        """Give the claims of expired workers (of those named in ``among``, when given) back to ``ready/``
        (attempt + 1); returns how many. This queue's next claims take them first: they are the oldest
        work, and a step may be waiting on them."""
        moved = []
        for worker in visible(listdir(self.claimed)):
            if among is not None and worker not in among:
                continue
            files = visible(listdir(self.claimed / worker))
            if not files or not self.liveness.expired(worker):
                continue
            for file_name in files:
                name, attempt = _split(file_name)
                try:
                    os.rename(self.claimed / worker / file_name, self.ready / f"{name}@{attempt + 1}")
                    moved.append(f"{name}@{attempt + 1}")
                except FileNotFoundError:
                    pass  # its holder finished or released it just now
        self._candidates += moved  # claim() pops from the end
        return len(moved)

    def holders(self) -> dict[str, str]:
        """Each claimed task's name -> the worker whose claim directory holds it (file-name forms)."""
        return {_split(n)[0]: worker for worker in visible(listdir(self.claimed))
                for n in visible(listdir(self.claimed / worker))}

    def counts(self) -> dict[str, int]:
        claimed = sum(len(visible(listdir(self.claimed / w))) for w in visible(listdir(self.claimed)))
        return {"tasks_ready": len(visible(listdir(self.ready))), "tasks_claimed": claimed,
                "tasks_done": len(visible(listdir(self.done)))}
