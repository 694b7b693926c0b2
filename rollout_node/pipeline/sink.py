"""Where a rollout node's finished groups go: the spool's shard writer, and ``finish_task`` once
a group's shard is published.

Guarantee: a task is finished only after the shard holding its whole group is published (the
writer keeps the open shard in memory; a task marked done whose rows die with the process would
be lost). Until then its lease, kept alive by the node's heartbeat, covers it. While ``seal_now()``
holds (the trainer waits for samples: :mod:`~rollout_node.pipeline.control`), a written group's
shard is sealed at once instead of at its age limit. Not thread-safe: the node calls it under its
write lock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from hpc.errors import SpoolError
from hpc.spool import RolloutSpool
from hpc.trajectory import Trajectory
from rollout_node.pipeline.episode import Group

log = logging.getLogger("spoolrl.rollout")


class GroupSink:
    def __init__(self, spool: RolloutSpool, worker_id: str, seal_now: Callable[[], bool]) -> None:
        self._spool = spool
        self._seal_now = seal_now
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
        if self._seal_now():
            self.flush()
        else:
            self.finish_published()
        return True

    def seal_now(self) -> bool:
        """Whether to seal the open shard now rather than at its age limit (the trainer waits for samples)."""
        return self._seal_now()

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
        """Publish the open shard now (instead of at its age limit) and finish what it holds. A full disk is
        logged: the groups stay pending, the writer's age thread and ``close`` try again, the leases cover them."""
        try:
            self.writer.flush()
        except SpoolError:
            log.exception("sealing the open shard early failed; it stays pending")
        self.finish_published()

    def close(self) -> None:
        """Publish everything and finish every written group (raises if the last shard cannot be)."""
        self._writer_cm.__exit__(None, None, None)
        self.finish_published(all_=True)
