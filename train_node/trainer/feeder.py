"""Rank 0's task feeder: the dataset, epoch by epoch, into the spool's task queue.

Guarantees:
- Order: epoch ``e`` is the instance list shuffled by ``random.Random(f"{shuffle_seed}:{e}")``;
  position ``p`` of the whole run is ``(epoch, index) = divmod(p, len(instances))``.
- Task ids are deterministic, ``f"{instance_id}@e{epoch}"``, so putting the same position twice
  (after a resume) is a no-op in the spool.
- Backpressure: at most ``max_outstanding`` tasks are put and not yet resolved (trained, or
  dropped as a group) by the consumer.
- Resume: ``next_position`` is saved in the checkpoint; positions put after the checkpoint are put
  again (no-ops), so the order continues where the lineage left off.
- Each task carries the policy version it was issued under and the group size.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from hpc.errors import UsageError


class TaskSink(Protocol):
    def put_tasks(self, tasks: list[dict[str, Any]]) -> int: ...


def epoch_order(instance_ids: list[str], seed: int, epoch: int) -> list[str]:
    order = list(instance_ids)
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
    next_position: int = 0
    _orders: dict[int, list[str]] = field(default_factory=dict, repr=False)

    @property
    def total(self) -> int:
        return len(self.instance_ids) * self.epochs

    @property
    def exhausted(self) -> bool:
        return self.next_position >= self.total

    def task_at(self, position: int, policy_version: int) -> dict[str, Any]:
        epoch, index = divmod(position, len(self.instance_ids))
        if epoch not in self._orders:
            self._orders[epoch] = epoch_order(self.instance_ids, self.seed, epoch)
        iid = self._orders[epoch][index]
        return {"task_id": f"{iid}@e{epoch}", "instance_id": iid, "epoch": epoch, "position": position,
                "group_size": self.group_size, "policy_version": policy_version}

    def top_up(self, sink: TaskSink, tasks_resolved: int, policy_version: int) -> int:
        """Put tasks until ``max_outstanding`` are unresolved; returns how many positions advanced."""
        room = self.max_outstanding - (self.next_position - tasks_resolved)
        n = max(0, min(room, self.total - self.next_position))
        if n:
            sink.put_tasks([self.task_at(p, policy_version) for p in range(self.next_position, self.next_position + n)])
            self.next_position += n
        return n

    def to_json(self) -> dict[str, Any]:
        return {"next_position": self.next_position}

    def restore(self, data: dict[str, Any]) -> None:
        self.next_position = int(data.get("next_position", 0))


def builtin_tasks_file(name: str = "tasks.jsonl") -> Path:
    """A shipped task set's JSONL, located without importing ``rollout_node`` (train_node never imports it)."""
    import importlib.util

    spec = importlib.util.find_spec("rollout_node")
    if spec is None or not spec.submodule_search_locations:
        raise UsageError("tasks.source: built-in sets need the rollout_node package installed next to train_node")
    return Path(list(spec.submodule_search_locations)[0]) / "tasks" / "builtin" / name


def instance_ids_for(source: str) -> list[str]:
    """The instance ids the feeder issues for ``tasks.source`` (a built-in set's name or a JSONL path)."""
    from hpc.config.tasks import builtin_task_file

    builtin = builtin_task_file(source)
    path = builtin_tasks_file(builtin) if builtin is not None else Path(source)
    try:
        return instance_ids_from_jsonl(path)
    except (OSError, ValueError, KeyError) as exc:
        raise UsageError(f"tasks.source: cannot read instance ids from {path} ({exc}); give a SWE-bench JSONL "
                         "file with an 'instance_id' on every line, or 'builtin'") from exc
