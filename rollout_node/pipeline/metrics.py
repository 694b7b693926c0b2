"""Node metrics: one JSONL file per rollout node (``RUN/metrics/rollout-<node>.jsonl``).

Records (``kind``):
- ``episode``: one per finished sample: status, reward, time queued and inside each stage.
- ``fault``: one per fault of a sample attempt (the fault table's row, the stage, the error).
- ``node``: every ``rollout.metrics_interval_s``: queue depth and busy workers per stage, p50/p95
  time per stage (over the last 512 episodes), episodes per minute since start, failures by kind,
  groups written / released, whether the node is claiming and why not.
Thread-safe: every stage worker reports here.
"""

from __future__ import annotations

import collections
import threading
import time
from pathlib import Path
from typing import Any

from hpc.metrics import MetricsWriter

STAGES = ("init", "run", "eval")


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


class NodeMetrics:
    """Counters and stage timings of one node, written to its own metrics file."""

    def __init__(self, run_dir: Path, node_id: str, window: int = 512) -> None:
        self.writer = MetricsWriter(run_dir, f"rollout-{node_id}")
        self.t0 = time.monotonic()
        self.lock = threading.Lock()
        self.stage_s: dict[str, collections.deque[float]] = {s: collections.deque(maxlen=window) for s in STAGES}
        self.group_s: collections.deque[float] = collections.deque(maxlen=window)
        self.failures: collections.Counter[str] = collections.Counter()
        self.statuses: collections.Counter[str] = collections.Counter()
        self.episodes = 0
        self.groups_written = 0
        self.groups_released = 0

    def stage_done(self, stage: str, seconds: float) -> None:
        with self.lock:
            self.stage_s[stage].append(seconds)

    def failure(self, kind: str) -> None:
        with self.lock:
            self.failures[kind] += 1

    def fault(self, record: dict[str, Any]) -> None:
        self.writer.log("fault", **record)

    def episode(self, record: dict[str, Any]) -> None:
        with self.lock:
            self.episodes += 1
            self.statuses[str(record.get("status"))] += 1
        self.writer.log("episode", **record)

    def group_done(self, seconds: float, *, released: bool) -> None:
        with self.lock:
            if released:
                self.groups_released += 1
            else:
                self.groups_written += 1
                self.group_s.append(seconds)

    def p95_group_s(self) -> float | None:
        with self.lock:
            return percentile(list(self.group_s), 0.95)

    def stage_percentiles(self) -> dict[str, dict[str, float | None]]:
        with self.lock:
            return {s: {"p50": percentile(list(v), 0.5), "p95": percentile(list(v), 0.95), "n": float(len(v))}
                    for s, v in self.stage_s.items()}

    def snapshot(self, **gauges: Any) -> dict[str, Any]:
        minutes = max(1e-9, (time.monotonic() - self.t0) / 60)
        with self.lock:
            counts: dict[str, Any] = {"episodes": self.episodes, "groups_written": self.groups_written,
                      "groups_released": self.groups_released, "failures": dict(self.failures),
                      "statuses": dict(self.statuses)}
        return {**counts, "episodes_per_min": round(counts["episodes"] / minutes, 3),
                "stage_s": self.stage_percentiles(), **gauges}

    def log_node(self, **gauges: Any) -> dict[str, Any]:
        snap = self.snapshot(**gauges)
        self.writer.log("node", **snap)
        return snap
