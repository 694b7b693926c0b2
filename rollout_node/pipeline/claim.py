"""A claimed spool task, parsed once at claim time: the lease, the task record and the task.

Guarantees: the record is read with :meth:`hpc.records.TaskRecord.from_json` and the task parsed
by the node's :class:`~rollout_node.pipeline.bindings.TaskOps` exactly once per claim; everything
downstream (the group, its episodes, their trajectories, the spool's ``finish``/``release``) reads
the typed fields, so the dedup attempt is the lease's own ``attempt`` (an ``int`` mypy checks) and
``task_version`` the record's. A task that cannot be read is still a claim (``task`` None,
``error`` set): its group is closed as ``node_error`` at once and never reaches a stage.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from hpc.records import TaskRecord
from hpc.spool import TaskLease
from rollout_node.tasks.instance import TaskInstance


@dataclass(frozen=True)
class Claim:
    """One claimed task. ``attempt`` (the lease epoch) is the spool's deduplication key."""

    lease: TaskLease
    record: TaskRecord
    task: TaskInstance | None  # None: malformed (``error`` says why)
    error: str = ""

    @property
    def task_id(self) -> str:
        return self.lease.task_id

    @property
    def attempt(self) -> int:
        return self.lease.attempt

    @property
    def fields(self) -> Mapping[str, Any]:
        """The record as the spool holds it (what policies read ``sampling_params`` etc. from)."""
        return self.lease.task


def read_claim(lease: TaskLease, parse: Callable[[Mapping[str, Any]], TaskInstance]) -> Claim:
    """Parse a lease's task record and task once; a failure of either makes a malformed claim."""
    try:
        record = TaskRecord.from_json(lease.task)
    except Exception as exc:  # noqa: BLE001 - a malformed task is accounted for, not fatal
        return Claim(lease, TaskRecord(task_id=lease.task_id), None, f"malformed task: {exc}")
    try:
        return Claim(lease, record, parse(lease.task))
    except Exception as exc:  # noqa: BLE001 - the task's own fault (bad fields, unknown instance)
        return Claim(lease, record, None, f"malformed task: {exc}")
