"""A failing rollout node stops itself: K infrastructure faults in a row (``rollout.max_consecutive_infra_faults``)
mean the node, not the tasks, is broken (a full disk, a lost image cache, an unreachable inference network).
An inference outage counts only once ``inference.outage_wait_s`` has passed without any server answering (the
client waits a restart out first: rollout_node/agent/client.py).

Guarantee: every infrastructure fault of an episode (each attempt, retried or final) counts; any
outcome that is not infrastructure (a trainable sample, a stale or cancelled one) resets the count.
When the count reaches the limit :meth:`InfraStreak.fault` returns the reason once; the node then
stops claiming, releases its tasks and exits non-zero with that reason. Thread-safe: stage workers
report concurrently. A limit of 0 turns the check off.
"""

from __future__ import annotations

import threading

from hpc.trajectory import Status
from rollout_node.pipeline.faults import OUTCOMES, Fault


def is_infrastructure(fault: Fault) -> bool:
    """Faults outside the agent's reach that end (after retries) as an infrastructure status."""
    return OUTCOMES[fault].status.infrastructure


class InfraStreak:
    """Counts consecutive infrastructure faults of one node."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0
        self.tripped = ""
        self._lock = threading.Lock()

    def fault(self, fault: Fault, error: str) -> str:
        """Count ``fault`` if it is infrastructure; the stop reason when this one reaches the limit, else ''."""
        if not is_infrastructure(fault):
            return ""
        with self._lock:
            self.count += 1
            if not self.limit or self.count < self.limit or self.tripped:
                return ""
            self.tripped = (f"{self.count} consecutive infrastructure faults "
                            f"(rollout.max_consecutive_infra_faults={self.limit}); last: {fault.value}: {error[-300:]}")
            return self.tripped

    def outcome(self, status: Status) -> None:
        """A finished sample: anything but an infrastructure status resets the count."""
        if not status.infrastructure:
            with self._lock:
                self.count = 0
