"""Rank 0's task feeder: the dataset, epoch by epoch, into the spool's task queue, and every task
issued followed until the consumer resolves it.

Guarantees:
- Order: epoch ``e`` is the instance list (duplicate ids removed, first kept) shuffled by
  ``random.Random(f"{shuffle_seed}:{e}")`` (``tasks.order: shuffle``), or as the file lists it in
  every epoch (``tasks.order: file``: a curriculum, or batches the file's order balances); position
  ``p`` of the whole run is ``(epoch, index) = divmod(p, len(instances))``.
- Task ids are deterministic, ``f"{instance_id}@e{epoch}"``, so putting the same position twice
  (after a resume) is a no-op in the spool.
- Backpressure: at most ``max_outstanding`` tasks are issued and not yet resolved (trained, or
  dropped as a group) by the consumer. The outstanding tasks are a set of ids, so a task delivered
  twice resolves once and a duplicate id in the dataset is never waited for twice.
- Nothing is waited for that the spool no longer holds: a task that is neither ready nor claimed
  (finished, or its file lost to a read error) and is not held by the consumer is *suspect*, with
  the shards not yet taken in at that moment. A shard is published before its task is finished,
  so once all those shards are taken in (claimed, quarantined or committed by a stale trainer)
  and the task is still unresolved, its results are lost: the task is reissued (``done`` back to
  ``ready`` with the next attempt, or put again when its file is gone). After ``MAX_REISSUES`` it
  is given up (``lost``, saved in the checkpoint) so the run never waits for it. Judged from
  listings only, no clocks.
- Resume: ``next_position`` and the outstanding tasks are saved in the checkpoint; positions put
  after the checkpoint are put again (no-ops), so the order continues where the lineage left off.
- Each task carries the policy version it was issued under and the group size.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from hpc.errors import UsageError
from hpc.records import TaskRecord
from hpc.spool import ConsumerSpool

MAX_REISSUES = 3


class Resolutions(Protocol):
    """What the feeder asks the consumer (:class:`train_node.trainer.consumer.Consumer`)."""

    def is_resolved(self, task_id: str) -> bool: ...

    def held_tasks(self) -> set[str]: ...


def epoch_order(instance_ids: list[str], seed: int, epoch: int, *, shuffle: bool = True) -> list[str]:
    order = list(instance_ids)
    if shuffle:
        random.Random(f"{seed}:{epoch}").shuffle(order)
    return order


def instance_ids_from_jsonl(path: Path) -> list[str]:
    """``instance_id`` of every line of a SWE-bench-style JSONL file (order kept)."""
    out = []
    for line in path.read_text().splitlines():
        if line.strip():
            out.append(str(json.loads(line)["instance_id"]))
    return out


@dataclass
class Feeder:
    instance_ids: list[str]
    epochs: int
    seed: int
    group_size: int
    max_outstanding: int
    consumer_id: str = "trainer"
    shuffle: bool = True  # False: every epoch in the file's order (tasks.order: file)
    next_position: int = 0
    outstanding: dict[str, int] = field(default_factory=dict)  # task id -> position
    reissues: dict[str, int] = field(default_factory=dict)
    lost: list[str] = field(default_factory=list)
    duplicates: int = field(init=False, default=0)
    events: list[dict[str, Any]] = field(default_factory=list, repr=False)  # reissued / lost, for the metrics
    _suspects: dict[str, frozenset[str]] = field(default_factory=dict, repr=False)
    _orders: dict[int, list[str]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        unique = list(dict.fromkeys(self.instance_ids))
        self.duplicates = len(self.instance_ids) - len(unique)
        self.instance_ids = unique

    @property
    def total(self) -> int:
        return len(self.instance_ids) * self.epochs

    @property
    def exhausted(self) -> bool:
        return self.next_position >= self.total

    @property
    def finished(self) -> bool:
        """Every position issued and every issued task resolved (or given up)."""
        return self.exhausted and not self.outstanding

    def task_at(self, position: int, policy_version: int) -> dict[str, Any]:
        epoch, index = divmod(position, len(self.instance_ids))
        if epoch not in self._orders:
            self._orders[epoch] = epoch_order(self.instance_ids, self.seed, epoch, shuffle=self.shuffle)
        iid = self._orders[epoch][index]
        return TaskRecord(task_id=f"{iid}@e{epoch}", instance_id=iid, epoch=epoch, position=position,
                          group_size=self.group_size, policy_version=policy_version).to_json()

    def top_up(self, spool: ConsumerSpool, consumer: Resolutions, policy_version: int) -> int:
        """Settle resolved and lost tasks, then put new ones until ``max_outstanding`` are outstanding;
        returns how many positions advanced. The caller holds the consumer's lock."""
        for task_id in [t for t in self.outstanding if consumer.is_resolved(t)]:
            del self.outstanding[task_id]
            self._suspects.pop(task_id, None)
        self._settle_lost(spool, consumer, policy_version)
        room = self.max_outstanding - len(self.outstanding)
        n = max(0, min(room, self.total - self.next_position))
        if n:
            tasks = [self.task_at(p, policy_version) for p in range(self.next_position, self.next_position + n)]
            spool.put_tasks(tasks)
            self.outstanding.update((t["task_id"], t["position"]) for t in tasks)
            self.next_position += n
        return n

    def _settle_lost(self, spool: ConsumerSpool, consumer: Resolutions, policy_version: int) -> None:
        """Find outstanding tasks whose results the spool no longer holds; reissue or give them up."""
        held = consumer.held_tasks()
        candidates = [t for t in self.outstanding if t not in held]
        for task_id in set(self._suspects) - set(candidates):
            del self._suspects[task_id]
        if not candidates:
            return
        open_ = spool.open_tasks(candidates)  # tasks first, shards after: a finished task's shard is listed
        unconsumed = frozenset(spool.unconsumed_shards(self.consumer_id))
        for task_id in candidates:
            if task_id in open_:
                self._suspects.pop(task_id, None)
            elif task_id not in self._suspects:
                self._suspects[task_id] = unconsumed
            elif not self._suspects[task_id] & unconsumed:
                del self._suspects[task_id]
                self._lost(spool, task_id, policy_version)

    def _lost(self, spool: ConsumerSpool, task_id: str, policy_version: int) -> None:
        tries = self.reissues.get(task_id, 0)
        if tries >= MAX_REISSUES:
            del self.outstanding[task_id]
            self.lost.append(task_id)
            self.events.append({"event": "task_lost", "task_id": task_id, "reissues": tries})
            return
        self.reissues[task_id] = tries + 1
        how = spool.reissue_task(self.task_at(self.outstanding[task_id], policy_version))
        self.events.append({"event": "task_reissued", "task_id": task_id, "how": how, "reissue": tries + 1})

    def take_events(self) -> list[dict[str, Any]]:
        events, self.events = self.events, []
        return events

    def to_json(self) -> dict[str, Any]:
        return {"next_position": self.next_position, "outstanding": sorted(self.outstanding.items(), key=lambda x: x[1]),
                "reissues": dict(sorted(self.reissues.items())), "lost": list(self.lost)}

    def restore(self, data: dict[str, Any]) -> None:
        self.next_position = int(data.get("next_position", 0))
        if "outstanding" in data:
            self.outstanding = {str(t): int(p) for t, p in data["outstanding"]}
        else:  # a checkpoint of an older version: at most the last max_outstanding positions were open
            lo = max(0, self.next_position - self.max_outstanding)
            self.outstanding = {self.task_at(p, 0)["task_id"]: p for p in range(lo, self.next_position)}
        self.reissues = {str(k): int(v) for k, v in data.get("reissues", {}).items()}
        self.lost = [str(t) for t in data.get("lost", [])]


def instance_ids_for(path: Path) -> list[str]:
    """The instance ids the feeder issues for the task file ``path`` (the CLI resolves ``tasks.source``
    to it: a built-in set is a file of rollout_node, which train_node never imports)."""
    try:
        return instance_ids_from_jsonl(path)
    except (OSError, ValueError, KeyError) as exc:
        raise UsageError(f"tasks.source: cannot read instance ids from {path} ({exc}); give a SWE-bench JSONL "
                         "file with an 'instance_id' on every line, or 'builtin'") from exc
