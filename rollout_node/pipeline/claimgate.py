"""Whether a rollout node may claim a task now, and if not, why (the ``not_claiming`` gauge).

Reasons, first match wins: ``max_episodes`` (the node claimed its share), ``backpressure``
(``spool.pending_work() >= spool.max_ready_shards``; read at most once per poll interval: at a
thousand nodes the spool is listed often), what the policy says it lacks (``not_ready()``, e.g.
``no_inference_server``: a claim now would only burn the task's retries), ``time_limit`` (the job's
remaining time is below the p95 group time + ``rollout.time_limit_margin_s``). Draining is the
node's own business (it never claims then, whatever this says).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from hpc.config import RunConfig
from rollout_node.pipeline.control import JobClock
from rollout_node.pipeline.metrics import NodeMetrics
from rollout_node.pipeline.policy import Policy, ReportsReadiness


class ClaimGate:
    def __init__(self, config: RunConfig, pending_work: Callable[[], int], policy: Policy, clock: JobClock,
                 metrics: NodeMetrics) -> None:
        self.config, self.policy, self.clock, self.metrics = config, policy, clock, metrics
        self._read_pending = pending_work
        self._pending: tuple[float, int] = (0.0, 0)

    def reason(self, claimed_samples: int, max_episodes: int | None) -> str:
        """'' when a claim may go ahead, else the first reason why not."""
        if max_episodes is not None and claimed_samples >= max_episodes:
            return "max_episodes"
        if self._pending_work() >= self.config.spool.max_ready_shards:
            return "backpressure"
        if not_ready := self._policy_not_ready():
            return not_ready
        remaining = self.clock.remaining_s()
        p95 = self.metrics.p95_group_s() or 0.0
        if remaining is not None and remaining < p95 + self.config.rollout.time_limit_margin_s:
            return "time_limit"
        return ""

    def _policy_not_ready(self) -> str:
        return self.policy.not_ready() if isinstance(self.policy, ReportsReadiness) else ""

    def _pending_work(self) -> int:
        at, value = self._pending
        if time.monotonic() - at > self.config.spool.poll_interval_s:
            value = int(self._read_pending())
            self._pending = (time.monotonic(), value)
        return value
