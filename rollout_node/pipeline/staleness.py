"""The rollout side of the one staleness rule (``algorithm.max_staleness``, ``hpc.trajectory.staleness``).

Guarantees:
- An episode is cancelled when its sample *would* exceed the limit by the time the trainer sees it:
  its staleness is measured against ``policy/LATEST`` plus a margin, the whole versions the trainer
  is expected to publish while the episode's EVAL runs (observed version rate x p95 EVAL time,
  rounded down). So EVAL time does not push finished samples over the limit, where the trainer
  would drop them.
- Rounded down, not up: an expectation under one version is no version. Rounded up, any version
  rate at all made the margin 1, and at ``max_staleness`` 1 every sample a version behind was
  cancelled in RUN: measured with ``scripts/bench_overlap.py`` (trainer at 0.25 of the rollout time),
  64 of 128 rollouts cancelled and redone, where rounding down cancels none and the trainer drops none.
- The margin is 0 until both a version change and an EVAL time have been observed, and never more
  than the limit itself (an episode is always allowed to start).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from hpc.trajectory import staleness


class StalenessGuard:
    def __init__(self, max_staleness: int, latest: Callable[[], int], eval_p95_s: Callable[[], float | None]) -> None:
        self.max_staleness = max_staleness
        self.latest = latest
        self.eval_p95_s = eval_p95_s
        self._first: tuple[float, int] | None = None

    def versions_per_s(self) -> float:
        """Versions published per second since this node first saw LATEST (0 before any change)."""
        now, version = time.monotonic(), self.latest()
        if self._first is None:
            self._first = (now, version)
            return 0.0
        t0, v0 = self._first
        return (version - v0) / (now - t0) if now > t0 and version > v0 else 0.0

    def margin(self) -> int:
        eval_s = self.eval_p95_s()
        if not eval_s:
            return 0
        return min(self.max_staleness, math.floor(self.versions_per_s() * eval_s))

    def too_stale(self, oldest: int | None) -> bool:
        """True when a sample whose oldest generated token has version ``oldest`` must be cancelled."""
        if oldest is None:
            return False
        return staleness(self.latest() + self.margin(), [oldest]) > self.max_staleness
