"""The INIT, RUN and EVAL worker threads of a rollout node.

Each worker takes episodes from its stage's bounded queue, runs the stage
(:mod:`rollout_node.pipeline.stages`) and hands the episode to the next queue or to its end
(:class:`~rollout_node.pipeline.outcomes.NodeBase`). An episode of a closed group is discarded; an
unexpected error on one episode is a ``pipeline_bug`` fault of that episode, never the worker's end.
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Callable

from hpc.trajectory import Status
from rollout_node.pipeline.episode import Episode
from rollout_node.pipeline.faults import Fault
from rollout_node.pipeline.outcomes import TICK_S, NodeBase
from rollout_node.pipeline.stages import remove_workdir

log = logging.getLogger("spoolrl.rollout")


class NodeWorkers(NodeBase):
    """The stage worker threads (INIT -> RUN -> EVAL)."""

    def _worker(self, stage: str, body: Callable[[Episode], None]) -> None:
        q = self.queues[stage]
        while not self.stopping.is_set():
            try:
                ep = q.get(timeout=TICK_S)
            except queue.Empty:
                continue
            if ep.group.closed:  # written or released meanwhile; an open group never loses an episode
                self._discard(ep)
                continue
            try:
                body(ep)
            except Exception as exc:  # noqa: BLE001 - a bug on one episode must not kill the worker
                log.exception("%s worker: unexpected error on %s", stage, ep.key)
                remove_workdir(ep)
                self._fault(ep, Fault.PIPELINE_BUG, f"{type(exc).__name__}: {exc}")

    def _do_init(self, ep: Episode) -> None:
        ep.group.started = True
        ep.enter("init")
        with self.lock:
            self.live.add(ep)
        result = self.stages.init(ep)
        self.metrics.stage_done("init", ep.leave("run_queue"))
        if result.fault is not None:
            self._fault(ep, result.fault, result.error)
        else:
            self._put("run", ep)

    def _do_run(self, ep: Episode) -> None:
        ep.enter("run")
        result = self.stages.run(ep)
        self.metrics.stage_done("run", ep.leave("eval_queue"))
        if result.fault is None and self.staleness.too_stale(ep.transcript.min_version()):
            result.fault, result.error = Fault.STALE, "too stale after RUN"
        if result.fault is not None:
            self._fault(ep, result.fault, result.error)
        else:
            self._put("eval", ep)

    def _do_eval(self, ep: Episode) -> None:
        ep.enter("eval")
        outcome = self.stages.evaluate(ep, lambda: not ep.group.closed)
        self.metrics.stage_done("eval", ep.leave("done"))
        if outcome.status.infrastructure:
            ep.metrics["error"] = str(outcome.details.get("error", outcome.status.value))
            self._record_fault(ep, Fault.HARNESS_ERROR, "eval", ep.metrics["error"],
                               eval_tries=ep.metrics.get("eval_tries", 1))
            if not self._node_failing(ep, Fault.HARNESS_ERROR, ep.metrics["error"]):
                self._complete(ep, outcome.status, None)
            return
        ep.metrics.update({k: v for k, v in outcome.details.items() if isinstance(v, (int, float, str, bool))})
        status = ep.output.status if ep.output is not None else Status.OK
        self._complete(ep, status, outcome.reward)
