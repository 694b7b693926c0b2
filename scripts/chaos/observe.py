"""What the soak watches while the roles run: the run's metrics, the inference servers' endpoint
records (reloads in progress), the trainer's idle stretches and zombies among the roles' processes.

Guarantees: each observer only records (the checks in :mod:`.audit` judge); times are monotonic
seconds of this process.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc.paths import RunPaths
from hpc.records import scan_endpoints
from scripts.chaos.procs import descendants, process_table

ZOMBIE_BOUND_S = 30.0


@dataclass(frozen=True)
class InferServer:
    """One ``endpoints/infer-*.json`` record: the file, the engine process, the reload in progress."""

    file: str
    server_pid: int | None
    loading: int | None
    url: str | None

    @property
    def key(self) -> tuple[str, int | None]:
        return self.file, self.server_pid


def infer_servers(run: RunPaths) -> list[InferServer]:
    out = []
    for path, rec in scan_endpoints(run.endpoints, "infer-*.json"):
        pid = rec.extra.get("server_pid")
        out.append(InferServer(path.name, pid if isinstance(pid, int) else None, rec.loading, rec.url))
    return out


def ready_shards(run: RunPaths) -> set[str]:
    try:
        return {n for n in os.listdir(run.root / "spool" / "shards" / "ready") if n.endswith(".shard")}
    except OSError:
        return set()


class MetricsTail:
    """The run's metrics records, read incrementally (each file from where the last read ended)."""

    def __init__(self, run: RunPaths) -> None:
        self.run = run
        self.offsets: dict[Path, int] = {}
        self.records: dict[str, list[dict[str, Any]]] = {}

    def of(self, kind: str) -> list[dict[str, Any]]:
        self.refresh()
        return self.records.get(kind, [])

    def refresh(self) -> None:
        for path in sorted(self.run.metrics.glob("*.jsonl")):
            self._read_new(path)

    def _read_new(self, path: Path) -> None:
        with open(path, "rb") as f:
            f.seek(self.offsets.get(path, 0))
            data = f.read()
        end = data.rfind(b"\n") + 1  # a torn last line is read again next time
        self.offsets[path] = self.offsets.get(path, 0) + end
        for line in data[:end].splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            self.records.setdefault(str(rec.get("kind")), []).append(rec)


class Reloads:
    """Every reload seen in endpoints/ (``loading`` set): when it began and how it ended."""

    def __init__(self) -> None:
        self.open: dict[tuple[str, int | None, int], float] = {}
        self.done: list[dict[str, Any]] = []

    def observe(self, servers: list[InferServer], t: float) -> None:
        live = {(*s.key, s.loading) for s in servers if s.loading is not None}
        for key in live - set(self.open):
            self.open[key] = t
        up = {s.key for s in servers}
        for key in set(self.open) - live:
            ended = "finished or failed" if key[:2] in up else "server gone"
            self.done.append({"version": key[2], "seconds": round(t - self.open.pop(key), 1), "ended": ended})

    def close_all(self, t: float, why: str) -> None:
        for key, t0 in self.open.items():
            self.done.append({"version": key[2], "seconds": round(t - t0, 1), "ended": why})
        self.open.clear()


class Waits:
    """Longest stretch with a started trainer alive, a shard waiting in ready/ and no step landing."""

    def __init__(self, metrics: MetricsTail) -> None:
        self.metrics, self.longest, self.steps_seen = metrics, 0.0, 0
        self.since: float | None = None

    def observe(self, trainer_up: bool, ready: set[str], t: float) -> None:
        steps = len(self.metrics.of("train_step"))
        stepped, self.steps_seen = steps > self.steps_seen, steps
        if not trainer_up or not ready or stepped:
            self.since = None
            return
        self.since = t if self.since is None else self.since
        self.longest = max(self.longest, t - self.since)


class Zombies:
    """Zombies among the roles' descendants, by (pid, start time); a leak if seen for ZOMBIE_BOUND_S.
    Also remembers every pid of the roles' trees (the owners of sandbox cgroups)."""

    def __init__(self) -> None:
        self.first: dict[tuple[int, str], float] = {}
        self.worst = 0.0
        self.pids: set[int] = set()

    def observe(self, roots: list[int], t: float) -> None:
        tree = process_table()
        for root in roots:
            self.pids.add(root)
            for pid in descendants(tree, root):
                self.pids.add(pid)
                if tree[pid].state == "Z":
                    first = self.first.setdefault((pid, tree[pid].start), t)
                    self.worst = max(self.worst, t - first)
