"""The INIT, RUN and EVAL worker threads of a rollout node.

Each worker takes episodes from its stage's bounded queue, runs the stage
(:mod:`rollout_node.pipeline.stages`) and hands the episode to the next queue or to its end
(:class:`~rollout_node.pipeline.outcomes.Outcomes`). An episode of a closed group is discarded; an
unexpected error on one episode is a ``pipeline_bug`` fault of that episode, never the worker's end.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from hpc.trajectory import Status
from rollout_node.pipeline.episode import Episode
from rollout_node.pipeline.faults import Fault
from rollout_node.pipeline.metrics import NodeMetrics
from rollout_node.pipeline.outcomes import Outcomes
from rollout_node.pipeline.stages import Stages, remove_workdir
from rollout_node.pipeline.staleness import StalenessGuard
from rollout_node.pipeline.state import InFlight, StageQueues

log = logging.getLogger("spoolrl.rollout")


class StageWorkers:
    """The bodies of the stage worker threads (INIT -> RUN -> EVAL)."""

    def __init__(self, stages: Stages, staleness: StalenessGuard, metrics: NodeMetrics, inflight: InFlight,
                 outcomes: Outcomes, queues: StageQueues, stopping: threading.Event) -> None:
        self.stages, self.staleness, self.metrics, self.inflight = stages, staleness, metrics, inflight
        self.outcomes, self.queues, self.stopping = outcomes, queues, stopping
        self.bodies: dict[str, Callable[[Episode], None]] = {"init": self._init, "run": self._run,
                                                             "eval": self._eval}

    def work(self, stage: str) -> None:
        """One worker thread of ``stage``: runs until the node stops."""
        body = self.bodies[stage]
        while not self.stopping.is_set():
            ep = self.queues.get(stage)
            if ep is None:
                continue
            if ep.group.closed:  # written or released meanwhile; an open group never loses an episode
                self.outcomes.discard(ep)
                continue
            try:
                body(ep)
            except Exception as exc:  # noqa: BLE001 - a bug on one episode must not kill the worker
                log.exception("%s worker: unexpected error on %s", stage, ep.key)
                remove_workdir(ep)
                self.outcomes.fault(ep, Fault.PIPELINE_BUG, f"{type(exc).__name__}: {exc}")

    def _init(self, ep: Episode) -> None:
        ep.group.started = True
        ep.enter("init")
        self.inflight.add_live(ep)
        result = self.stages.init(ep)
        self.metrics.stage_done("init", ep.leave("run_queue"))
        if result.fault is not None:
            self.outcomes.fault(ep, result.fault, result.error)
        else:
            self.queues.put("run", ep)

    def _run(self, ep: Episode) -> None:
        ep.enter("run")
        result = self.stages.run(ep)
        self.metrics.stage_done("run", ep.leave("eval_queue"))
        if result.fault is None and self.staleness.too_stale(ep.transcript.min_version()):
            result.fault, result.error = Fault.STALE, "too stale after RUN"
        if result.fault is not None:
            self.outcomes.fault(ep, result.fault, result.error)
        else:
            self.queues.put("eval", ep)

    def _eval(self, ep: Episode) -> None:
        ep.enter("eval")
        outcome = self.stages.evaluate(ep, lambda: not ep.group.closed)
        self.metrics.stage_done("eval", ep.leave("done"))
        if outcome.status.infrastructure:
            ep.metrics["error"] = str(outcome.details.get("error", outcome.status.value))
            self.outcomes.record_fault(ep, Fault.HARNESS_ERROR, "eval", ep.metrics["error"],
                                       eval_tries=ep.metrics.get("eval_tries", 1))
            if not self.outcomes.node_failing(ep, Fault.HARNESS_ERROR, ep.metrics["error"]):
                self.outcomes.complete(ep, outcome.status, None)
            return
        ep.metrics.update({k: v for k, v in outcome.details.items() if isinstance(v, (int, float, str, bool))})
        status = ep.output.status if ep.output is not None else Status.OK
        self.outcomes.complete(ep, status, outcome.reward)
