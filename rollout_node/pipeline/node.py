"""The rollout node: a feeder that claims tasks, three worker pools joined by bounded queues
(INIT -> RUN -> EVAL), a heartbeat thread, and a control loop (timeouts, cancellation,
staleness, drain, metrics) in the calling thread.

Guarantees:
- A claimed task ends exactly one way on this node: its whole group (``group_size`` samples,
  each with a final status) is written with ``writer.add_group`` and then ``finish_task``-ed; or
  it is ``release_task``-ed back to the spool (drain, or a failed write). Nothing of a task is
  written before its whole group is done, so a node killed at any point leaves only a lease that
  expires.
- A failure of one episode follows the fault table (:mod:`rollout_node.pipeline.faults`) and
  never stops a worker thread or the node.
- Stop order: the node's record (:mod:`hpc.rollout_presence`) exists from before its first claim until
  every task it held is released or written, so inference keeps serving its drain; an episode whose
  inference fails while draining releases its task instead of ending as ``inference_error``.
- A failing node stops itself (:mod:`~rollout_node.pipeline.health`): it releases every task and
  :meth:`RolloutNode.run` returns with :attr:`RolloutNode.failed` set (the CLI exits non-zero).
- Claiming stops on drain (signal, ``STOP``), on backpressure (``spool.pending_work() >=
  spool.max_ready_shards``), when the job's remaining time is below the p95 group time plus
  ``rollout.time_limit_margin_s``, and after ``max_episodes`` samples.
- Live sandboxes never exceed ``run + eval`` workers; queued episodes hold no sandbox.

:class:`RolloutNode` is put together from collaborators, one module each: :mod:`.state` (the spool
behind one lock, the groups and episodes in flight, the drain, the stage queues), :mod:`.outcomes`
(how an episode or a group ends: written, retried, released, cancelled), :mod:`.claims` (the feeder
and heartbeat threads), :mod:`.workers` (the INIT/RUN/EVAL workers); each holds only the parts it
uses, and the spool as the :class:`~hpc.spool.RolloutSpool` face. This module holds the node's
lifecycle and the control loop.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc import rollout_presence
from hpc.config import RunConfig
from hpc.errors import SandboxError
from hpc.paths import RunPaths
from hpc.spool import RolloutSpool
from rollout_node.pipeline.bindings import TaskOps
from rollout_node.pipeline.claimgate import ClaimGate
from rollout_node.pipeline.claims import Claims
from rollout_node.pipeline.control import ControlFiles, JobClock
from rollout_node.pipeline.episode import Episode, Group
from rollout_node.pipeline.metrics import NodeMetrics
from rollout_node.pipeline.outcomes import EpisodeNotes, Outcomes
from rollout_node.pipeline.policy import Policy
from rollout_node.pipeline.scratch import remove_dead_sandbox_scratch, remove_dead_scratch, remove_tree
from rollout_node.pipeline.sizing import Workers
from rollout_node.pipeline.stages import Stages
from rollout_node.pipeline.staleness import StalenessGuard
from rollout_node.pipeline.state import STAGES, TICK_S, Drain, InFlight, LockedSpool, StageQueues
from rollout_node.pipeline.workers import StageWorkers

__all__ = ["NodeOptions", "RolloutNode"]

log = logging.getLogger("spoolrl.rollout")
ABORT_GRACE_S = 5.0  # after run_timeout_s the policy had this long to stop by itself


@dataclass
class NodeOptions:
    node_id: str
    workers: Workers
    scratch: Path
    max_episodes: int | None = None
    once: bool = False


class RolloutNode:
    """One rollout node process (see the module docstring). ``notes``: what this kind of node adds to
    each finished episode's metrics (:data:`~rollout_node.pipeline.outcomes.EpisodeNotes`)."""

    def __init__(self, paths: RunPaths, config: RunConfig, spool: RolloutSpool, ops: TaskOps, policy: Policy,
                 options: NodeOptions, job_clock: JobClock | None = None, notes: EpisodeNotes | None = None) -> None:
        self.paths, self.config, self.opts, self.rollout = paths, config, options, config.rollout
        self.worker_id = f"{options.node_id}.{os.getpid()}.{secrets.token_hex(2)}"
        self.scratch = options.scratch / self.worker_id
        self.control = ControlFiles(paths, config.spool.poll_interval_s)
        clock = job_clock or JobClock()
        self.metrics = NodeMetrics(paths.root, options.node_id)
        self.spool = LockedSpool(spool)
        self.stopping = threading.Event()
        self.inflight = InFlight()
        self.drain = Drain(self.rollout, clock)
        self.queues = StageQueues(self.rollout.queue_size, self.stopping)
        self.staleness = StalenessGuard(config.algorithm.max_staleness, lambda: self.control.latest_version,
                                        lambda: self.metrics.stage_percentiles()["eval"]["p95"])
        self.outcomes = Outcomes(config, self.worker_id, self.spool, self.metrics, self.inflight, self.drain, notes)
        gate = ClaimGate(config, self.spool.pending_work, policy, clock, self.metrics)
        self.claims = Claims(config, self.worker_id, self.spool, ops, gate, self.control, self.inflight, self.drain,
                             self.outcomes, self.queues, self.stopping, options.max_episodes)
        stages = Stages(config, ops, policy, self.scratch, lambda: self.control.latest_version,
                        lambda: self.drain.reason is not None)
        self.workers = StageWorkers(stages, self.staleness, self.metrics, self.inflight, self.outcomes, self.queues,
                                    self.stopping)
        self._threads: list[threading.Thread] = []

    @property
    def failed(self) -> str:
        """Why the node stopped itself (:mod:`~rollout_node.pipeline.health`); '' while healthy."""
        return self.drain.failed

    def request_drain(self, reason: str) -> None:
        """Stop claiming; in-flight groups may finish until the drain deadline, then are released
        (at once after a signal Slurm sent the whole step). Safe from a signal handler."""
        self.drain.request(reason)

    # ------------------------------------------------------------------ lifecycle
    def run(self) -> dict[str, Any]:
        """Run until an exit condition holds (see :mod:`hpc.cli.rollout`); returns the final metrics snapshot."""
        remove_dead_scratch(self.opts.scratch, self.opts.node_id)
        from rollout_node.sandbox.sandbox import user_scratch

        with contextlib.suppress(SandboxError):  # unusable scratch: the first sandbox says so
            remove_dead_sandbox_scratch(user_scratch(self.config.sandbox) / "sbx")
        self.scratch.mkdir(parents=True, exist_ok=True)
        rollout_presence.announce(self.paths, self.worker_id, os.getpid())
        self.outcomes.open_sink(lambda: self.control.trainer_waiting)
        log.info("rollout node %s: workers init=%d run=%d eval=%d, scratch %s", self.worker_id,
                 self.opts.workers.init, self.opts.workers.run, self.opts.workers.eval, self.scratch)
        self._start_threads()
        next_metrics = time.monotonic() + self.rollout.metrics_interval_s
        try:
            while not self._finished():
                self._tick()
                if time.monotonic() >= next_metrics:
                    next_metrics = time.monotonic() + self.rollout.metrics_interval_s
                    self.metrics.log_node(**self._gauges())
                time.sleep(TICK_S)
        finally:
            self._shutdown()
        return self.metrics.log_node(**self._gauges())

    def _start_threads(self) -> None:
        w = self.opts.workers
        specs: list[tuple[str, Callable[[], None]]] = [("feeder", self.claims.feeder),
                                                        ("heartbeat", self.claims.heartbeat)]
        for stage, count in zip(STAGES, (w.init, w.run, w.eval), strict=True):
            specs += [(f"{stage}-{i}", functools.partial(self.workers.work, stage)) for i in range(count)]
        for name, target in specs:
            t = threading.Thread(target=target, name=f"rollout-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def _shutdown(self) -> None:
        self.stopping.set()
        for t in self._threads:
            t.join(timeout=max(1.0, ABORT_GRACE_S))
        for group in self.inflight.snapshot()[0]:
            self.outcomes.release_group(group, "shutdown")
        self.outcomes.close_sink()
        rollout_presence.withdraw(self.paths, self.worker_id)  # nothing held any more: inference may stop
        remove_tree(self.scratch)
        log.info("rollout node %s stopped: %s", self.worker_id, self.metrics.snapshot())

    def _finished(self) -> bool:
        with self.inflight.lock:
            busy = bool(self.inflight.groups or self.inflight.retries or self.claims.claiming
                        or self.outcomes.awaiting())
        if busy:
            return False
        if self.drain.reason:
            return True
        if self.opts.max_episodes is not None and self.claims.claimed_samples >= self.opts.max_episodes:
            return True
        return self.opts.once and self.claims.spool_dry and self._spool_idle()

    def _spool_idle(self) -> bool:
        """--once: nothing ready and nothing claimed by anyone (expired leases come back first)."""
        try:
            counts = self.spool.task_counts()
        except Exception:  # noqa: BLE001 - the counts are advisory
            return True
        return not (counts["tasks_ready"] or counts["tasks_claimed"])

    # ------------------------------------------------------------------ control loop
    def _tick(self) -> None:
        self.control.refresh()
        if self.control.stop:
            self.request_drain("STOP marker")
        groups, live = self.inflight.snapshot()
        for group in groups:
            if not group.closed and self.control.cancelled(group.task_id):
                self.outcomes.cancel_group(group)
        for ep in live:
            self._check_episode(ep)
        if self.drain.reason:
            self._drain_step(groups)
        self.outcomes.finish_published()
        self.outcomes.flush_early()

    def _check_episode(self, ep: Episode) -> None:
        spent = ep.charged_s()
        if ep.stage == "run" and spent > self.rollout.run_timeout_s:
            ep.abort("timeout", hard=spent > self.rollout.run_timeout_s + ABORT_GRACE_S)
        if ep.stage == "run" and self.staleness.too_stale(ep.transcript.min_version()):
            ep.abort("stale")

    def _drain_step(self, groups: list[Group]) -> None:
        late = self.drain.late()
        for group in groups:
            if late or not group.started:
                self.outcomes.release_group(group, f"drain ({self.drain.reason})")

    def _gauges(self) -> dict[str, Any]:
        with self.inflight.lock:
            stages = collections.Counter(ep.stage for ep in self.inflight.live)
            groups = len(self.inflight.groups)
        return {"node": self.opts.node_id, "worker_id": self.worker_id, "groups_in_flight": groups,
                "queue_depth": self.queues.depth(),
                "busy": {s: stages.get(s, 0) for s in STAGES},
                "claimed_samples": self.claims.claimed_samples, "draining": self.drain.reason or "",
                "not_claiming": self.claims.not_claiming, "policy_version": self.control.latest_version}
