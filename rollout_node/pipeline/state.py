"""What a rollout node's collaborators share: the spool behind one lock, the groups and episodes in
flight, the drain state and the stage queues.

Guarantees: every spool call of a node goes through one :class:`LockedSpool` (a Spool object is
used from several threads, one call at a time); :class:`InFlight`'s collections change only under
its lock; a drain, once requested, is never withdrawn, and its deadline only moves earlier.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time

from hpc.config import RolloutConfig
from hpc.spool import RolloutSpool, ShardWriter, TaskLease
from rollout_node.pipeline.control import JobClock
from rollout_node.pipeline.episode import Episode, Group

log = logging.getLogger("spoolrl.rollout")
TICK_S = 0.2
STAGES = ("init", "run", "eval")
# Slurm sends these to every process of the step, and proctrack/linuxproc does it deepest first: a
# sandbox's processes (an EVAL's test runner, the agent's command) get it before the node, up to ~1 s
# before under load. No episode in flight then ran undisturbed: a killed runner reads as the agent's
# failure (reward 0). So its group goes back to the spool, never into a shard.
STEP_SIGNALS = frozenset({"SIGTERM"})


class LockedSpool:
    """The node's :class:`~hpc.spool.RolloutSpool`, one call at a time (its threads share one Spool)."""

    def __init__(self, spool: RolloutSpool) -> None:
        self._spool = spool
        self._lock = threading.Lock()

    def claim_task(self, worker_id: str) -> TaskLease | None:
        with self._lock:
            return self._spool.claim_task(worker_id)

    def heartbeat(self, worker_id: str) -> None:
        with self._lock:
            self._spool.heartbeat(worker_id)

    def writer(self, worker_id: str) -> ShardWriter:
        with self._lock:
            return self._spool.writer(worker_id)

    def finish_task(self, lease: TaskLease) -> bool:
        with self._lock:
            return self._spool.finish_task(lease)

    def release_task(self, lease: TaskLease) -> bool:
        with self._lock:
            return self._spool.release_task(lease)

    def pending_work(self) -> int:
        with self._lock:
            return self._spool.pending_work()

    def task_counts(self) -> dict[str, int]:
        with self._lock:
            return self._spool.task_counts()


class InFlight:
    """The groups claimed and not yet ended, the episodes inside a stage, the retries waiting."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.groups: dict[str, Group] = {}
        self.retries: collections.deque[Episode] = collections.deque()
        self.live: set[Episode] = set()

    def add_live(self, ep: Episode) -> None:
        with self.lock:
            self.live.add(ep)

    def discard(self, ep: Episode) -> None:
        with self.lock:
            self.live.discard(ep)

    def live_of(self, group: Group) -> list[Episode]:
        with self.lock:
            return [ep for ep in self.live if ep.group is group]

    def add_retry(self, ep: Episode) -> None:
        with self.lock:
            self.retries.append(ep)

    def take_retry(self) -> Episode | None:
        with self.lock:
            return self.retries.popleft() if self.retries else None

    def remove_group(self, group: Group) -> None:
        with self.lock:
            self.groups.pop(group.task_id, None)

    def snapshot(self) -> tuple[list[Group], list[Episode]]:
        with self.lock:
            return list(self.groups.values()), list(self.live)


class Drain:
    """Whether and until when the node drains, and why it stopped itself (``failed``)."""

    def __init__(self, rollout: RolloutConfig, clock: JobClock) -> None:
        self.rollout, self.clock = rollout, clock
        self.reason: str | None = None
        self.deadline = float("inf")
        self.step_signalled = ""  # a signal from STEP_SIGNALS arrived: nothing more is written
        self.failed = ""  # why the node stopped itself (see health.py); '' while healthy

    def request(self, reason: str) -> None:
        """Stop claiming; in-flight groups may finish until the drain deadline, then are released.
        After a signal Slurm sent the whole step (STEP_SIGNALS) they are released at once."""
        if reason in STEP_SIGNALS:
            self.step_signalled = reason
            self.deadline = time.monotonic()
        if self.reason:
            return
        budget = 0.0 if self.step_signalled else self.rollout.drain_timeout_s
        remaining = self.clock.remaining_s()
        if remaining is not None:
            budget = min(budget, max(0.0, remaining - 5.0))  # release before Slurm's kill
        self.reason, self.deadline = reason, time.monotonic() + budget
        log.info("draining (%s): no new claims; in-flight groups have %.0f s", reason, budget)

    def fail(self, reason: str) -> None:
        """The node stops itself: drain with no time left."""
        self.failed = reason
        self.request("failing")
        self.deadline = time.monotonic()

    def late(self) -> bool:
        return time.monotonic() >= self.deadline


class StageQueues:
    """The bounded queues in front of INIT, RUN and EVAL (``rollout.queue_size`` each)."""

    def __init__(self, size: int, stopping: threading.Event) -> None:
        self.stopping = stopping
        self.queues: dict[str, queue.Queue[Episode]] = {s: queue.Queue(maxsize=size) for s in STAGES}

    def put(self, stage: str, ep: Episode) -> None:
        """Queue ``ep`` for ``stage``, waiting for room (gives up once the node stops)."""
        while not self.stopping.is_set():
            try:
                self.queues[stage].put(ep, timeout=TICK_S)
                return
            except queue.Full:
                continue

    def get(self, stage: str) -> Episode | None:
        """The next episode for ``stage``, or None after a tick without one."""
        try:
            return self.queues[stage].get(timeout=TICK_S)
        except queue.Empty:
            return None

    def depth(self) -> dict[str, int]:
        return {s: q.qsize() for s, q in self.queues.items()}
