"""Where a rollout node's finished groups go: the spool's shard writer, and ``finish_task`` once
a group's shard is published.

Guarantee: a task is finished only after the shard holding its whole group is published (the
writer keeps the open shard in memory; a task marked done whose rows die with the process would
be lost). Until then its lease, kept alive by the node's heartbeat, covers it. Not thread-safe:
the node calls it under its write lock.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from hpc.spool import RolloutSpool
from hpc.trajectory import Trajectory
from rollout_node.pipeline.episode import Group

log = logging.getLogger("spoolrl.rollout")


class GroupSink:
    def __init__(self, spool: RolloutSpool, worker_id: str) -> None:
        self._spool = spool
        self._writer_cm = spool.writer(worker_id)
        self.writer = self._writer_cm.__enter__()
        self.awaiting: list[tuple[int, Group]] = []  # (shards published when written, group)

    def write(self, group: Group, trajectories: Sequence[Trajectory]) -> bool:
        """Queue the group's rows; False (logged) if the writer refused them (e.g. disk full)."""
        try:
            self.writer.add_group(trajectories)
        except Exception:  # noqa: BLE001 - the caller releases the task; the node goes on
            log.exception("writing the group of %s failed; releasing the task", group.task_id)
            return False
        self.awaiting.append((len(self.writer.published), group))
        self.finish_published()
        return True

    def finish_published(self, *, all_: bool = False) -> None:
        """``finish_task`` every written group whose shard is published (``all_``: the writer closed)."""
        published, pending = len(self.writer.published), self.writer.pending()
        keep = []
        for mark, group in self.awaiting:
            if all_ or pending == 0 or published > mark:
                self._spool.finish_task(group.claim.lease)
            else:
                keep.append((mark, group))
        self.awaiting = keep

    def flush(self) -> None:
        """Publish the open shard now (instead of at its age limit) and finish what it holds."""
        self.writer.flush()
        self.finish_published()

    def close(self) -> None:
        """Publish everything and finish every written group (raises if the last shard cannot be)."""
        self._writer_cm.__exit__(None, None, None)
        self.finish_published(all_=True)
