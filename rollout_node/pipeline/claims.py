"""The feeder and heartbeat threads of a rollout node.

The feeder claims tasks from the spool while :class:`~rollout_node.pipeline.claimgate.ClaimGate`
allows (drain, backpressure, job time left, ``max_episodes``), keeps up to
``rollout.claim_lookahead`` claimed groups as a backlog (a task whose image is cached first), and
queues a group's episodes for INIT; retries go first. On drain or shutdown it releases its backlog.
The heartbeat thread shows the spool that the node lives (which keeps its leases) every
``spool.heartbeat_interval_s``.
"""

from __future__ import annotations

import logging

from hpc.spool import TaskLease
from hpc.trajectory import Status
from rollout_node.pipeline.claim import read_claim
from rollout_node.pipeline.episode import Episode, Group
from rollout_node.pipeline.outcomes import NodeBase

log = logging.getLogger("spoolrl.rollout")


class NodeClaims(NodeBase):
    """The feeder (claims) and heartbeat threads."""

    # ------------------------------------------------------------------ feeder (claims)
    def _feeder(self) -> None:
        backlog: list[Group] = []
        while not self.stopping.is_set():
            try:
                if not self._feed_once(backlog):
                    self.stopping.wait(self.config.spool.poll_interval_s)
            except Exception:  # noqa: BLE001 - a spool hiccup must not kill the feeder
                log.exception("feeder: claiming failed; retrying")
                self.metrics.failure("claim_error")
                self.stopping.wait(self.config.spool.poll_interval_s)
        for group in backlog:
            self._release_group(group, "shutdown")

    def _feed_once(self, backlog: list[Group]) -> bool:
        with self.lock:
            retry = self.retries.popleft() if self.retries else None
        if retry is not None:
            self._put("init", retry)
            return True
        if self.draining:
            while backlog:
                self._release_group(backlog.pop(), f"drain ({self.draining})")
            return False
        while len(backlog) < self.rollout.claim_lookahead and self._may_claim():
            group = self._claim()
            if group is None:
                break
            backlog.append(group)
        if not backlog:
            return False
        group = next((g for g in backlog if self.ops.image_cached(g.image)), backlog[0])
        backlog.remove(group)
        for i in range(group.size):
            if group.closed:
                break
            self._put("init", Episode(group, i, 0, self._seed(group, i, 0)))
        return True

    def _may_claim(self) -> bool:
        self.not_claiming = self.gate.reason(self.claimed_samples, self.opts.max_episodes)
        return not self.not_claiming and not self.draining

    def _claim(self) -> Group | None:
        with self.lock:
            self.claiming = True
        try:
            lease = self._spool_call(self.spool.claim_task, self.worker_id)
            group = self._group_of(lease) if lease is not None else None
            self.spool_dry = lease is None
            return group
        finally:
            with self.lock:
                self.claiming = False

    def _group_of(self, lease: TaskLease) -> Group | None:
        claim = read_claim(lease, self.ops.parse)
        size = claim.record.group_size or self.config.algorithm.group_size
        group = Group(claim=claim, size=size, image=self.ops.image(claim.task) if claim.task is not None else "")
        with self.lock:
            self.groups[group.task_id] = group
            self.claimed_samples += size
        if claim.task is None:
            self._close_with(group, Status.NODE_ERROR, claim.error)
            return None
        self.control.refresh()
        if self.control.cancelled(group.task_id):
            self._cancel_group(group)
            return None
        return group

    # ------------------------------------------------------------------ heartbeat
    def _heartbeat(self) -> None:
        while True:
            try:
                self._spool_call(self.spool.heartbeat, self.worker_id)
            except Exception:  # noqa: BLE001 - one missed beat is survivable; the lease is long
                log.exception("heartbeat failed")
            if self.stopping.wait(self.config.spool.heartbeat_interval_s):
                return
