"""The shard side of the spool: ``shards/{ready,claimed,committed,quarantine,commits}``.

Guarantees (the exactly-once rules of :mod:`hpc.spool`, implemented here):

- A shard is claimed by one consumer (rename into ``claimed/<consumer>@g<generation>/``), in the
  order this object first listed it (:mod:`hpc.arrival`); a corrupt one is quarantined with a reason.
- Deduplication by task id: the first (writer session, attempt) that delivers a task id owns it;
  its rows from any other shard are dropped as ``duplicate_task`` and the drop is written into the
  commit record, from which the owners are rebuilt after a restart.
- ``commit``, ``uncommit`` and ``recover`` check the fence first (:class:`hpc.spool.fencing.Fencing`).
"""

from __future__ import annotations

import json
import secrets
import socket
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from hpc.arrival import ReadyWatch
from hpc.config.spool import SpoolConfig
from hpc.errors import CorruptShardError
from hpc.fsutil import TMP_PREFIX, TmpCleaner, atomic_write_json, listdir, publish_file, safe_name, try_rename, visible
from hpc.shard import (
    SUFFIX,
    ShardWriter,
    decode_table,
    read_shard_bytes,
    shard_count,
    table_trajectories,
    writer_session,
)
from hpc.spool.fencing import Fencing
from hpc.trajectory import Trajectory

ShardInfo = dict[str, Any]  # a commit record's entry for one shard: owners, dropped rows, count (JSON)


class Shard:
    """A claimed, verified shard. ``trajectories()`` yields its rows minus duplicates of other shards."""

    def __init__(self, shard_id: str, path: Path, table: pa.Table, keep: list[int], info: ShardInfo):
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


class ShardQueue:
    """Publishing, claiming, deduplicating and committing shards (one consumer generation per object)."""

    def __init__(self, root: Path, config: SpoolConfig, fencing: Fencing) -> None:
        self.root, self.config, self.fencing = root, config, fencing
        self.ready, self.claimed = root / "ready", root / "claimed"  # made by Spool
        self.committed, self.quarantine, self.commits = root / "committed", root / "quarantine", root / "commits"
        self._owners: dict[str, str] | None = None  # task_id -> "writer session#attempt" that owns it
        self._watch = ReadyWatch(self.ready)
        self._cleaner = TmpCleaner(config.lease_s)
        self._made: set[Path] = set()
        self._next_sweep = 0.0
        self._infos: dict[str, ShardInfo] = {}  # claimed here, not yet committed
        self.corrupt_detected = 0

    # -- writing -------------------------------------------------------------------------------
    def writer(self, worker_id: str) -> ShardWriter:
        return ShardWriter(self.ready, worker_id, self.config)

    def pending_work(self) -> int:
        return sum(1 for n in visible(listdir(self.ready)) if n.endswith(SUFFIX))

    def unconsumed(self, consumer_id: str) -> set[str]:
        mine = self._claim_dir_path(consumer_id)
        names = set(visible(listdir(self.ready)))
        for d in visible(listdir(self.claimed)):
            if self.claimed / d != mine:
                names.update(visible(listdir(self.claimed / d)))
        return {n for n in names if n.endswith(SUFFIX)}

    # -- claiming ------------------------------------------------------------------------------
    def claim(self, consumer_id: str, max_shards: int, *, if_changed: bool = False) -> list[Shard]:
        self._maybe_sweep(consumer_id)
        if if_changed and not self._watch.changed():
            return []
        listing = listdir(self.ready)
        self._cleaner.clean(self.ready, listing)
        names = self._watch.order(n for n in visible(listing) if n.endswith(SUFFIX))
        if not names or max_shards <= 0:
            return []
        self.fencing.check(consumer_id)
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

    def _claim_dir_path(self, consumer_id: str) -> Path:
        return self.claimed / f"{safe_name(consumer_id)}@g{self.fencing.held(consumer_id)}"

    def _claim_dir(self, consumer_id: str) -> Path:
        path = self._claim_dir_path(consumer_id)
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

    # -- deduplication by task id --------------------------------------------------------------
    def _dedup(self, shard_id: str, table: pa.Table) -> tuple[list[int], ShardInfo]:
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
            for record in self.commit_records():
                for info in record.get("shards", {}).values():
                    for task_id, key in info.get("owners", {}).items():
                        owners.setdefault(task_id, key)
            self._owners = owners
        return self._owners

    def commit_records(self) -> Iterator[dict[str, Any]]:
        """The commit records (JSON objects), oldest first; unreadable ones are skipped."""
        for name in sorted(visible(listdir(self.commits))):
            try:
                yield json.loads((self.commits / name).read_bytes())
            except (OSError, ValueError):
                continue

    # -- commit / uncommit / recover -----------------------------------------------------------
    def commit(self, consumer_id: str, shard_ids: Sequence[str], checkpoint: str = "") -> int:
        generation = self.fencing.check(consumer_id)
        mine = self._claim_dir(consumer_id)
        done = [sid for sid in shard_ids if try_rename(mine / f"{sid}{SUFFIX}", self.committed / f"{sid}{SUFFIX}")]
        if done:
            self._write_commit_record(consumer_id, generation, {sid: self._shard_info(sid) for sid in done},
                                      checkpoint)
        return len(done)

    def _shard_info(self, shard_id: str) -> ShardInfo:
        info = self._infos.pop(shard_id, None)
        if info is None:  # claimed before a restart: recompute (same deterministic rule, shard order)
            try:
                table = decode_table(read_shard_bytes(self.committed / f"{shard_id}{SUFFIX}"), shard_id)
                info = self._dedup(shard_id, table)[1]
            except (CorruptShardError, OSError) as exc:
                info = {"owners": {}, "dropped": [], "count": shard_count(shard_id), "error": str(exc)}
        return info

    def _write_commit_record(self, consumer_id: str, generation: int, shards: dict[str, ShardInfo],
                             checkpoint: str = "") -> None:
        record = {"consumer": consumer_id, "generation": generation, "t": time.time(), "shards": shards,
                  "checkpoint": checkpoint}
        name = f"{generation:08d}-{int(time.time() * 1000):013d}-{secrets.token_hex(4)}.json"
        publish_file(self.commits / name, json.dumps(record).encode(), replace=True)  # a unique name

    def uncommit(self, consumer_id: str, checkpoints: Iterable[str]) -> int:
        self.fencing.check(consumer_id)
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
        generation = self.fencing.check(consumer_id)
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
        return out

    def _maybe_sweep(self, consumer_id: str) -> None:
        """Now and then, the current consumer returns shards that stale generations claimed after
        its ``recover`` (a fenced trainer that still ran for a while) to ready."""
        generation = self.fencing.held(consumer_id)
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

    # -- housekeeping --------------------------------------------------------------------------
    def clean(self, directory: Path) -> int:
        """Remove temporaries of dead writers in ``directory``."""
        return self._cleaner.clean(directory, listdir(directory))

    def counts(self) -> dict[str, int]:
        """Shards and trajectories by state, duplicate drops, temporaries in ``ready/``."""
        out: dict[str, int] = {}
        ready_all = listdir(self.ready)
        groups = {"ready": [n for n in visible(ready_all) if n.endswith(SUFFIX)],
                  "claimed": [n for d in visible(listdir(self.claimed)) for n in visible(listdir(self.claimed / d))],
                  "committed": visible(listdir(self.committed)),
                  "quarantined": [n for n in visible(listdir(self.quarantine)) if n.endswith(SUFFIX)]}
        for state, names in groups.items():
            out[f"shards_{state}"] = len(names)
            out[f"trajectories_{state}"] = sum(shard_count(n[: -len(SUFFIX)]) for n in names)
        dropped = {sid: len(info.get("dropped", [])) for r in self.commit_records()
                   for sid, info in r.get("shards", {}).items()}  # a shard recorded twice counts once
        out["trajectories_dropped_duplicate"] = sum(dropped.values())
        out["tmp_files"] = sum(1 for n in ready_all if n.startswith(TMP_PREFIX))
        return out
