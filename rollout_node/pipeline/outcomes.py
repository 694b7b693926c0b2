"""The shared state of a rollout node and how its episodes and groups end.

:class:`NodeBase` holds what every thread of :class:`~rollout_node.pipeline.node.RolloutNode` shares
(queues, groups in flight, locks, the drain state) and decides each episode's end: completed into its
group (a complete group goes to the shard writer, :mod:`~rollout_node.pipeline.sink`, and its task is
finished once that shard is published), retried from INIT, or the whole group released back to the
spool or closed as cancelled, following the fault table
(:mod:`rollout_node.pipeline.faults`). The node's guarantees are stated in
:mod:`rollout_node.pipeline.node`; this module keeps the exactly-one-end rule: a group is written or
released once, under ``write_lock``, and marked ``closed`` first.
"""

from __future__ import annotations

import collections
import logging
import os
import queue
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from hpc.config import RunConfig
from hpc.paths import RunPaths
from hpc.spool import RolloutSpool
from hpc.trajectory import Status
from rollout_node.pipeline.bindings import TaskOps
from rollout_node.pipeline.claimgate import ClaimGate
from rollout_node.pipeline.control import ControlFiles, JobClock
from rollout_node.pipeline.episode import Episode, Group
from rollout_node.pipeline.faults import OUTCOMES, Fault
from rollout_node.pipeline.health import InfraStreak
from rollout_node.pipeline.metrics import NodeMetrics
from rollout_node.pipeline.policy import Policy
from rollout_node.pipeline.seeds import episode_seed
from rollout_node.pipeline.sink import GroupSink
from rollout_node.pipeline.sizing import Workers
from rollout_node.pipeline.stages import Stages, remove_workdir
from rollout_node.pipeline.staleness import StalenessGuard

log = logging.getLogger("spoolrl.rollout")
T = TypeVar("T")
TICK_S = 0.2
ABORT_GRACE_S = 5.0  # after run_timeout_s the policy had this long to stop by itself
# Slurm sends these to every process of the step, and proctrack/linuxproc does it deepest first: a
# sandbox's processes (an EVAL's test runner, the agent's command) get it before the node, up to ~1 s
# before under load. No episode in flight then ran undisturbed: a killed runner reads as the agent's
# failure (reward 0). So its group goes back to the spool, never into a shard.
STEP_SIGNALS = frozenset({"SIGTERM"})


@dataclass
class NodeOptions:
    node_id: str
    workers: Workers
    scratch: Path
    max_episodes: int | None = None
    once: bool = False


class NodeBase:
    """State shared by the node's threads, and the end of every episode and group."""

    def __init__(self, paths: RunPaths, config: RunConfig, spool: RolloutSpool, ops: TaskOps, policy: Policy,
                 options: NodeOptions, job_clock: JobClock | None = None) -> None:
        self.paths, self.config, self.spool, self.ops, self.opts = paths, config, spool, ops, options
        self.rollout = config.rollout
        self.worker_id = f"{options.node_id}.{os.getpid()}.{secrets.token_hex(2)}"
        self.scratch = options.scratch / self.worker_id
        self.control = ControlFiles(paths, config.spool.poll_interval_s)
        self.clock = job_clock or JobClock()
        self.metrics = NodeMetrics(paths.root, options.node_id)
        self.policy = policy
        self.stages = Stages(config, ops, policy, self.scratch, lambda: self.control.latest_version)
        self.staleness = StalenessGuard(config.algorithm.max_staleness, lambda: self.control.latest_version,
                                        lambda: self.metrics.stage_percentiles()["eval"]["p95"])
        size = self.rollout.queue_size
        self.queues: dict[str, queue.Queue[Episode]] = {s: queue.Queue(maxsize=size) for s in ("init", "run", "eval")}
        self.lock = threading.RLock()
        self.write_lock = threading.Lock()
        self.spool_lock = threading.Lock()  # one Spool object, used from several threads
        self.groups: dict[str, Group] = {}
        self.retries: collections.deque[Episode] = collections.deque()
        self.live: set[Episode] = set()
        self.stopping = threading.Event()
        self.draining: str | None = None
        self.streak = InfraStreak(self.rollout.max_consecutive_infra_faults)
        self.failed = ""  # why the node stopped itself (see health.py); '' while healthy
        self.drain_deadline = float("inf")
        self.step_signalled = ""  # a signal from STEP_SIGNALS arrived: nothing more is written
        self.claiming = False
        self.spool_dry = False
        self.claimed_samples = 0
        self.not_claiming = ""
        self.gate = ClaimGate(config, lambda: int(self._spool_call(self.spool.pending_work)), policy, self.clock,
                              self.metrics)
        self._threads: list[threading.Thread] = []
        self.sink: GroupSink | None = None

    def request_drain(self, reason: str) -> None:
        """Stop claiming; in-flight groups may finish until the drain deadline, then are released.
        After a signal Slurm sent the whole step (STEP_SIGNALS) they are released at once."""
        if reason in STEP_SIGNALS:
            self.step_signalled = reason
            self.drain_deadline = time.monotonic()
        if self.draining:
            return
        budget = 0.0 if self.step_signalled else self.rollout.drain_timeout_s
        remaining = self.clock.remaining_s()
        if remaining is not None:
            budget = min(budget, max(0.0, remaining - 5.0))  # release before Slurm's kill
        self.draining, self.drain_deadline = reason, time.monotonic() + budget
        log.info("draining (%s): no new claims; in-flight groups have %.0f s", reason, budget)

    def _spool_call(self, fn: Callable[..., T], *args: object) -> T:
        with self.spool_lock:
            return fn(*args)

    def _seed(self, group: Group, sample_index: int, attempt: int) -> int:
        return episode_seed(self.config.run.seed, group.task_id, sample_index, attempt)

    def _put(self, stage: str, ep: Episode) -> None:
        while not self.stopping.is_set():
            try:
                self.queues[stage].put(ep, timeout=TICK_S)
                return
            except queue.Full:
                continue

    # ------------------------------------------------------------------ outcomes
    def _discard(self, ep: Episode) -> None:
        remove_workdir(ep)
        with self.lock:
            self.live.discard(ep)

    def _fault(self, ep: Episode, fault: Fault, error: str) -> None:
        if ep.group.closed:  # released or cancelled as a whole: already accounted for there
            self._discard(ep)
            return
        if self.draining and fault is Fault.INFERENCE_ERROR:  # the servers are stopping: not the task's fault
            self._release_group(ep.group, f"inference failed while draining ({error[-200:]})")
            self._discard(ep)
            return
        outcome = OUTCOMES[fault]
        ep.metrics["error"] = error
        log.info("%s: %s (%s)", ep.key, fault.value, error)
        self._record_fault(ep, fault, ep.last_stage, error[-2000:])
        if self._node_failing(ep, fault, error):
            return
        if outcome.retry_from == "init" and ep.attempt < self.rollout.max_retries and not ep.group.closed:
            nxt = Episode(ep.group, ep.sample_index, ep.attempt + 1,
                          self._seed(ep.group, ep.sample_index, ep.attempt + 1))
            nxt.metrics["previous_errors"] = [*ep.metrics.get("previous_errors", []), error]
            self._discard(ep)
            with self.lock:
                self.retries.append(nxt)
            return
        self._complete(ep, outcome.status, None)

    def _record_fault(self, ep: Episode, fault: Fault, stage: str, error: str, **extra: Any) -> None:
        self.metrics.failure(fault.value)
        self.metrics.fault({"task_id": ep.group.task_id, "sample_index": ep.sample_index, "attempt": ep.attempt,
                            "fault": fault.value, "stage": stage, "error": error, **extra})

    def _node_failing(self, ep: Episode, fault: Fault, error: str) -> bool:
        """Count an infrastructure fault; at the limit the node stops claiming and releases every task now
        (this episode's first): a failing node finishes nothing more."""
        if reason := self.streak.fault(fault, error):
            self.failed = reason
            log.error("rollout node %s stops itself: %s", self.worker_id, reason)
            self.request_drain("failing")
            self.drain_deadline = time.monotonic()
        if not self.failed:
            return False
        self._release_group(ep.group, f"node failing: {self.failed}")
        self._discard(ep)
        return True

    def _complete(self, ep: Episode, status: Status, reward: float | None) -> None:
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
        with self.lock:
            self.live.discard(ep)
            group = ep.group
            if group.closed:
                return
            group.results[ep.sample_index] = traj
            group.segments[ep.sample_index] = earlier
            done = group.complete
        if done:
            self._write_group(group)

    def _write_group(self, group: Group) -> None:
        with self.write_lock:
            if group.closed:
                return
            if self.step_signalled:  # its sandboxes got the signal first (STEP_SIGNALS): not its result
                self._release_locked(group)
                return
            group.closed = True
            assert self.sink is not None, "groups are written only while the node runs"
            if not self.sink.write(group, group.rows()):
                self.metrics.failure("write_error")  # e.g. disk full: the task goes back, the node goes on
                self._release_locked(group)
                return
        with self.lock:
            self.groups.pop(group.task_id, None)
        self.metrics.group_done(time.monotonic() - group.claimed_at, released=False)

    def _flush_idle(self) -> None:
        """Nothing in flight: publish the open shard now instead of waiting for its age limit."""
        with self.lock:
            idle = not self.groups
        if not (idle and self.sink is not None and self.sink.awaiting):
            return
        with self.write_lock:
            self.sink.flush()

    def _close_with(self, group: Group, status: Status, error: str) -> None:
        """Write every sample not yet finished with ``status`` (cancelled task, malformed task)."""
        with self.lock:
            live = [ep for ep in self.live if ep.group is group]
            missing = [i for i in range(group.size) if i not in group.results]
        for ep in live:
            ep.abort("cancelled")
        for i in missing:
            ep = Episode(group, i, 0, self._seed(group, i, 0))
            ep.metrics["error"] = error
            group.results[i] = ep.trajectory(status, None)
        self._write_group(group)

    def _cancel_group(self, group: Group) -> None:
        log.info("task %s cancelled (control/cancel)", group.task_id)
        self.metrics.failure(Fault.TASK_CANCELLED.value)
        self._close_with(group, Status.CANCELLED, "task cancelled")

    def _release_group(self, group: Group, why: str) -> None:
        with self.write_lock:
            if group.closed:
                return
            self._release_locked(group)
        log.info("released %s back to the spool: %s", group.task_id, why)

    def _release_locked(self, group: Group) -> None:
        group.closed = True
        with self.lock:
            live = [ep for ep in self.live if ep.group is group]
            self.groups.pop(group.task_id, None)
        for ep in live:
            ep.abort("drain")
        try:
            self._spool_call(self.spool.release_task, group.claim.lease)
        except Exception:  # noqa: BLE001 - the lease then expires and the spool reclaims the task
            log.exception("releasing %s failed; its lease will expire", group.task_id)
        self.metrics.group_done(time.monotonic() - group.claimed_at, released=True)
