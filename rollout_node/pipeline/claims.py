"""The feeder and heartbeat threads of a rollout node.

The feeder claims tasks from the spool while :class:`~rollout_node.pipeline.claimgate.ClaimGate`
allows (drain, backpressure, job time left, ``max_episodes``), keeps up to
``rollout.claim_lookahead`` claimed groups as a backlog (a task whose image is cached first), and
queues a group's episodes for INIT; retries go first. On drain or shutdown it releases its backlog.
Each claim is parsed once (:mod:`~rollout_node.pipeline.claim`). The heartbeat thread shows the
spool that the node lives (which keeps its leases) every ``spool.heartbeat_interval_s``.
"""

from __future__ import annotations

import logging
import threading

from hpc.config import RunConfig
from hpc.spool import RolloutSpool, TaskLease
from hpc.trajectory import Status
from rollout_node.pipeline.bindings import TaskOps
from rollout_node.pipeline.claim import read_claim
from rollout_node.pipeline.claimgate import ClaimGate
from rollout_node.pipeline.control import ControlFiles
from rollout_node.pipeline.episode import Group
from rollout_node.pipeline.outcomes import Outcomes
from rollout_node.pipeline.state import Drain, InFlight, StageQueues

log = logging.getLogger("spoolrl.rollout")


class Claims:
    """The feeder (claims) and heartbeat threads of one node."""

    def __init__(self, config: RunConfig, worker_id: str, spool: RolloutSpool, ops: TaskOps, gate: ClaimGate,
                 control: ControlFiles, inflight: InFlight, drain: Drain, outcomes: Outcomes,
                 queues: StageQueues, stopping: threading.Event, max_episodes: int | None) -> None:
        self.config, self.worker_id, self.spool, self.ops, self.gate = config, worker_id, spool, ops, gate
        self.control, self.inflight, self.drain, self.outcomes = control, inflight, drain, outcomes
        self.queues, self.stopping, self.max_episodes = queues, stopping, max_episodes
        self.claiming = False  # a claim is under way (read with the groups, under the in-flight lock)
        self.spool_dry = False  # the last claim found no task
        self.claimed_samples = 0
        self.not_claiming = ""  # why the gate refused the last claim ('' when it allowed it)

    # ------------------------------------------------------------------ feeder (claims)
    def feeder(self) -> None:
        backlog: list[Group] = []
        while not self.stopping.is_set():
            try:
                if not self._feed_once(backlog):
                    self.stopping.wait(self.config.spool.poll_interval_s)
            except Exception:  # noqa: BLE001 - a spool hiccup must not kill the feeder
                log.exception("feeder: claiming failed; retrying")
                self.outcomes.metrics.failure("claim_error")
                self.stopping.wait(self.config.spool.poll_interval_s)
        for group in backlog:
            self.outcomes.release_group(group, "shutdown")

    def _feed_once(self, backlog: list[Group]) -> bool:
        retry = self.inflight.take_retry()
        if retry is not None:
            self.queues.put("init", retry)
            return True
        if self.drain.reason:
            while backlog:
                self.outcomes.release_group(backlog.pop(), f"drain ({self.drain.reason})")
            return False
        while len(backlog) < self.config.rollout.claim_lookahead and self.may_claim():
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
            self.queues.put("init", self.outcomes.episode(group, i, 0))
        return True

    def may_claim(self) -> bool:
        """Whether the gate lets the feeder claim now (``not_claiming`` says why not)."""
        self.not_claiming = self.gate.reason(self.claimed_samples, self.max_episodes)
        return not self.not_claiming and not self.drain.reason

    def _claim(self) -> Group | None:
        with self.inflight.lock:
            self.claiming = True
        try:
            lease = self.spool.claim_task(self.worker_id)
            group = self._group_of(lease) if lease is not None else None
            self.spool_dry = lease is None
            return group
        finally:
            with self.inflight.lock:
                self.claiming = False

    def _group_of(self, lease: TaskLease) -> Group | None:
        claim = read_claim(lease, self.ops.parse)
        size = claim.record.group_size or self.config.algorithm.group_size
        group = Group(claim=claim, size=size, image=self.ops.image(claim.task) if claim.task is not None else "")
        with self.inflight.lock:
            self.inflight.groups[group.task_id] = group
            self.claimed_samples += size
        if claim.task is None:
            self.outcomes.close_with(group, Status.NODE_ERROR, claim.error)
            return None
        self.control.refresh()
        if self.control.cancelled(group.task_id):
            self.outcomes.cancel_group(group)
            return None
        return group

    # ------------------------------------------------------------------ heartbeat
    def heartbeat(self) -> None:
        while True:
            try:
                self.spool.heartbeat(self.worker_id)
            except Exception:  # noqa: BLE001 - one missed beat is survivable; the lease is long
                log.exception("heartbeat failed")
            if self.stopping.wait(self.config.spool.heartbeat_interval_s):
                return
