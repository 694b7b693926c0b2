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

:class:`RolloutNode` is put together from one module per responsibility: :mod:`.outcomes` (the state
the threads share, and how an episode or a group ends: written, retried, released, cancelled),
:mod:`.claims` (the feeder and heartbeat threads), :mod:`.workers` (the INIT/RUN/EVAL workers); this
module holds its lifecycle and the control loop.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from hpc import rollout_presence
from hpc.errors import SandboxError
from rollout_node.pipeline.claims import NodeClaims
from rollout_node.pipeline.episode import Episode, Group
from rollout_node.pipeline.outcomes import ABORT_GRACE_S, TICK_S, NodeOptions
from rollout_node.pipeline.scratch import remove_dead_sandbox_scratch, remove_dead_scratch, remove_tree
from rollout_node.pipeline.sink import GroupSink
from rollout_node.pipeline.workers import NodeWorkers

__all__ = ["NodeOptions", "RolloutNode"]

log = logging.getLogger("spoolrl.rollout")


class RolloutNode(NodeClaims, NodeWorkers):
    """One rollout node process (see the module docstring)."""

    # ------------------------------------------------------------------ lifecycle
    def run(self) -> dict[str, Any]:
        """Run until an exit condition holds (see :mod:`hpc.cli.rollout`); returns the final metrics snapshot."""
        remove_dead_scratch(self.opts.scratch, self.opts.node_id)
        from rollout_node.sandbox.sandbox import user_scratch

        with contextlib.suppress(SandboxError):  # unusable scratch: the first sandbox says so
            remove_dead_sandbox_scratch(user_scratch(self.config.sandbox) / "sbx")
        self.scratch.mkdir(parents=True, exist_ok=True)
        rollout_presence.announce(self.paths, self.worker_id, os.getpid())
        self.sink = GroupSink(self.spool, self.worker_id, self._spool_call)
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
        specs: list[tuple[str, Callable[[], None]]] = [("feeder", self._feeder), ("heartbeat", self._heartbeat)]
        specs += [(f"init-{i}", lambda: self._worker("init", self._do_init)) for i in range(w.init)]
        specs += [(f"run-{i}", lambda: self._worker("run", self._do_run)) for i in range(w.run)]
        specs += [(f"eval-{i}", lambda: self._worker("eval", self._do_eval)) for i in range(w.eval)]
        for name, target in specs:
            t = threading.Thread(target=target, name=f"rollout-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    def _shutdown(self) -> None:
        self.stopping.set()
        for t in self._threads:
            t.join(timeout=max(1.0, ABORT_GRACE_S))
        with self.lock:
            leftover = list(self.groups.values())
        for group in leftover:
            self._release_group(group, "shutdown")
        if self.sink is not None:
            with self.write_lock:
                self.sink.close()
        rollout_presence.withdraw(self.paths, self.worker_id)  # nothing held any more: inference may stop
        remove_tree(self.scratch)
        log.info("rollout node %s stopped: %s", self.worker_id, self.metrics.snapshot())

    def _finished(self) -> bool:
        with self.lock:
            busy = bool(self.groups or self.retries or self.claiming or (self.sink and self.sink.awaiting))
        if busy:
            return False
        if self.draining:
            return True
        if self.opts.max_episodes is not None and self.claimed_samples >= self.opts.max_episodes:
            return True
        return self.opts.once and self.spool_dry and self._spool_idle()

    def _spool_idle(self) -> bool:
        """--once: nothing ready and nothing claimed by anyone (expired leases come back first)."""
        try:
            counts = self._spool_call(self.spool.task_counts)
        except Exception:  # noqa: BLE001 - the counts are advisory
            return True
        return not (counts["tasks_ready"] or counts["tasks_claimed"])

    # ------------------------------------------------------------------ control loop
    def _tick(self) -> None:
        self.control.refresh()
        if self.control.stop:
            self.request_drain("STOP marker")
        with self.lock:
            groups = list(self.groups.values())
            live = list(self.live)
        for group in groups:
            if not group.closed and self.control.cancelled(group.task_id):
                self._cancel_group(group)
        for ep in live:
            self._check_episode(ep)
        if self.draining:
            self._drain_step(groups)
        if self.sink is not None:
            with self.write_lock:
                self.sink.finish_published()
        self._flush_idle()

    def _check_episode(self, ep: Episode) -> None:
        spent = ep.charged_s()
        if ep.stage == "run" and spent > self.rollout.run_timeout_s:
            ep.abort("timeout", hard=spent > self.rollout.run_timeout_s + ABORT_GRACE_S)
        if ep.stage == "run" and self.staleness.too_stale(ep.transcript.min_version()):
            ep.abort("stale")

    def _drain_step(self, groups: list[Group]) -> None:
        late = time.monotonic() >= self.drain_deadline
        for group in groups:
            if late or not group.started:
                self._release_group(group, f"drain ({self.draining})")

    def _gauges(self) -> dict[str, Any]:
        with self.lock:
            stages = collections.Counter(ep.stage for ep in self.live)
            groups = len(self.groups)
        return {"node": self.opts.node_id, "worker_id": self.worker_id, "groups_in_flight": groups,
                "queue_depth": {s: q.qsize() for s, q in self.queues.items()},
                "busy": {s: stages.get(s, 0) for s in ("init", "run", "eval")},
                "claimed_samples": self.claimed_samples, "draining": self.draining or "",
                "not_claiming": self.not_claiming, "policy_version": self.control.latest_version}
