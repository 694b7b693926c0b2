"""How a rollout node's episodes and groups end.

:class:`Outcomes` decides each episode's end: completed into its group (a complete group goes to the
shard writer, :mod:`~rollout_node.pipeline.sink`, and its task is finished once that shard is
published), retried from INIT, or the whole group released back to the spool or closed as
cancelled, following the fault table (:mod:`rollout_node.pipeline.faults`). The node's guarantees
are stated in :mod:`rollout_node.pipeline.node`; this module keeps the exactly-one-end rule: a
group is written or released once, under ``write_lock``, and marked ``closed`` first.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from hpc.config import RunConfig
from hpc.spool import RolloutSpool
from hpc.trajectory import Status
from rollout_node.pipeline.episode import Episode, Group
from rollout_node.pipeline.faults import OUTCOMES, Fault
from rollout_node.pipeline.health import InfraStreak
from rollout_node.pipeline.metrics import NodeMetrics
from rollout_node.pipeline.seeds import episode_seed
from rollout_node.pipeline.sink import GroupSink
from rollout_node.pipeline.stages import remove_workdir
from rollout_node.pipeline.state import Drain, InFlight

log = logging.getLogger("spoolrl.rollout")

# What a kind of node adds to each finished episode's metrics (before its trajectories are built),
# given the episode and the node's worker id: the rollout service's nodes keep the diff and the node.
EpisodeNotes = Callable[[Episode, str], None]


class Outcomes:
    """The end of every episode and group of one node, and the shard writer they end in."""

    def __init__(self, config: RunConfig, worker_id: str, spool: RolloutSpool, metrics: NodeMetrics,
                 inflight: InFlight, drain: Drain, notes: EpisodeNotes | None = None) -> None:
        self.config, self.rollout, self.worker_id = config, config.rollout, worker_id
        self.spool, self.metrics, self.inflight, self.drain = spool, metrics, inflight, drain
        self.notes = notes
        self.streak = InfraStreak(self.rollout.max_consecutive_infra_faults)
        self.write_lock = threading.Lock()
        self.sink: GroupSink | None = None

    def episode(self, group: Group, sample_index: int, attempt: int) -> Episode:
        """A new attempt of one sample, with its sampling seed."""
        return Episode(group, sample_index, attempt,
                       episode_seed(self.config.run.seed, group.task_id, sample_index, attempt))

    # ------------------------------------------------------------------ the shard writer
    def open_sink(self, seal_now: Callable[[], bool]) -> None:
        """The shard writer; ``seal_now()``: seal each written group's shard at once (the trainer waits)."""
        self.sink = GroupSink(self.spool, self.worker_id, seal_now)

    def awaiting(self) -> bool:
        """Written groups whose shard is not published yet (their tasks are not finished)."""
        return bool(self.sink and self.sink.awaiting)

    def finish_published(self) -> None:
        if self.sink is not None:
            with self.write_lock:
                self.sink.finish_published()

    def close_sink(self) -> None:
        if self.sink is not None:
            with self.write_lock:
                self.sink.close()

    def flush_early(self) -> None:
        """Publish the open shard now instead of waiting for its age limit when nothing is in flight or the
        trainer waits for samples (``seal_now``)."""
        if self.sink is None or not self.sink.awaiting:
            return
        with self.inflight.lock:
            idle = not self.inflight.groups
        if not (idle or self.sink.seal_now()):
            return
        with self.write_lock:
            self.sink.flush()

    # ------------------------------------------------------------------ episodes
    def discard(self, ep: Episode) -> None:
        remove_workdir(ep)
        self.inflight.discard(ep)

    def fault(self, ep: Episode, fault: Fault, error: str) -> None:
        if ep.group.closed:  # released or cancelled as a whole: already accounted for there
            self.discard(ep)
            return
        if self.drain.reason and fault is Fault.INFERENCE_ERROR:  # the servers are stopping: not the task's fault
            self.release_group(ep.group, f"inference failed while draining ({error[-200:]})")
            self.discard(ep)
            return
        outcome = OUTCOMES[fault]
        ep.metrics["error"] = error
        log.info("%s: %s (%s)", ep.key, fault.value, error)
        self.record_fault(ep, fault, ep.last_stage, error[-2000:])
        if self.node_failing(ep, fault, error):
            return
        if outcome.retry_from == "init" and ep.attempt < self.rollout.max_retries and not ep.group.closed:
            nxt = self.episode(ep.group, ep.sample_index, ep.attempt + 1)
            nxt.metrics["previous_errors"] = [*ep.metrics.get("previous_errors", []), error]
            self.discard(ep)
            self.inflight.add_retry(nxt)
            return
        self.complete(ep, outcome.status, None)

    def record_fault(self, ep: Episode, fault: Fault, stage: str, error: str, **extra: Any) -> None:
        self.metrics.failure(fault.value)
        self.metrics.fault({"task_id": ep.group.task_id, "sample_index": ep.sample_index, "attempt": ep.attempt,
                            "fault": fault.value, "stage": stage, "error": error, **extra})

    def node_failing(self, ep: Episode, fault: Fault, error: str) -> bool:
        """Count an infrastructure fault; at the limit the node stops claiming and releases every task now
        (this episode's first): a failing node finishes nothing more."""
        if reason := self.streak.fault(fault, error):
            log.error("rollout node %s stops itself: %s", self.worker_id, reason)
            self.drain.fail(reason)
        if not self.drain.failed:
            return False
        self.release_group(ep.group, f"node failing: {self.drain.failed}")
        self.discard(ep)
        return True

    def complete(self, ep: Episode, status: Status, reward: float | None) -> None:
        if self.notes is not None:
            self.notes(ep, self.worker_id)
        self.streak.outcome(status)
        *earlier, traj = ep.trajectories(status, reward)
        self.metrics.episode({"task_id": traj.task_id, "sample_index": traj.sample_index, "attempt": ep.attempt,
                              "status": traj.status.value, "reward": traj.reward, "timings": traj.timings,
                              "tokens": sum(t.num_tokens for t in (*earlier, traj)),
                              "generated_tokens": sum(t.num_generated for t in (*earlier, traj)),
                              "eval_shared": bool(ep.metrics.get("eval_shared", False)),
                              "error": ep.metrics.get("error", ""),
                              **({key: traj.metrics[key] for key in ("segments_per_episode", "reprefill_tokens")
                                  if key in traj.metrics})})
        with self.inflight.lock:
            self.inflight.live.discard(ep)
            group = ep.group
            if group.closed:
                return
            group.results[ep.sample_index] = traj
            group.segments[ep.sample_index] = earlier
            done = group.complete
        if done:
            self.write_group(group)

    # ------------------------------------------------------------------ groups
    def write_group(self, group: Group) -> None:
        with self.write_lock:
            if group.closed:
                return
            if self.drain.step_signalled:  # its sandboxes got the signal first (STEP_SIGNALS): not its result
                self._release_locked(group)
                return
            group.closed = True
            assert self.sink is not None, "groups are written only while the node runs"
            if not self.sink.write(group, group.rows()):
                self.metrics.failure("write_error")  # e.g. disk full: the task goes back, the node goes on
                self._release_locked(group)
                return
        self.inflight.remove_group(group)
        self.metrics.group_done(time.monotonic() - group.claimed_at, released=False)

    def close_with(self, group: Group, status: Status, error: str) -> None:
        """Write every sample not yet finished with ``status`` (cancelled task, malformed task)."""
        with self.inflight.lock:
            live = [ep for ep in self.inflight.live if ep.group is group]
            missing = [i for i in range(group.size) if i not in group.results]
        for ep in live:
            ep.abort("cancelled")
        for i in missing:
            ep = self.episode(group, i, 0)
            ep.metrics["error"] = error
            group.results[i] = ep.trajectory(status, None)
        self.write_group(group)

    def cancel_group(self, group: Group) -> None:
        log.info("task %s cancelled (control/cancel)", group.task_id)
        self.metrics.failure(Fault.TASK_CANCELLED.value)
        self.close_with(group, Status.CANCELLED, "task cancelled")

    def release_group(self, group: Group, why: str) -> None:
        with self.write_lock:
            if group.closed:
                return
            self._release_locked(group)
        log.info("released %s back to the spool: %s", group.task_id, why)

    def _release_locked(self, group: Group) -> None:
        group.closed = True
        with self.inflight.lock:
            live = [ep for ep in self.inflight.live if ep.group is group]
            self.inflight.groups.pop(group.task_id, None)
        for ep in live:
            ep.abort("drain")
        try:
            self.spool.release_task(group.claim.lease)
        except Exception:  # noqa: BLE001 - the lease then expires and the spool reclaims the task
            log.exception("releasing %s failed; its lease will expire", group.task_id)
        self.metrics.group_done(time.monotonic() - group.claimed_at, released=True)
