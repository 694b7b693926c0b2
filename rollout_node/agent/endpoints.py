"""Which inference servers are alive: ``RUN/endpoints/infer-*.json`` or a fixed URL list.

Liveness without clocks (DESIGN.md): a server is alive while the ``heartbeat`` counter in its
endpoint file keeps changing as seen on THIS process's monotonic clock; file mtimes and the
writer's wall clock are never compared with ours. A file seen for the first time counts as alive
for ``stale_after_s`` (we cannot tell yet); an unreadable or half-written file is skipped this
round (writers replace files atomically, so that is transient).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from hpc.records import scan_endpoints


class EndpointSource(Protocol):
    def live(self) -> list[str]: ...


@dataclass(frozen=True)
class StaticEndpoints:
    """A fixed list of server URLs (tests, a single laptop server)."""

    urls: Sequence[str]

    def live(self) -> list[str]:
        return list(self.urls)


@dataclass
class _Seen:
    heartbeat: int | None
    changed_at: float
    url: str


class EndpointDirectory:
    """Servers announced in an endpoints directory, filtered to fresh heartbeats."""

    def __init__(self, directory: str | Path, *, stale_after_s: float = 30.0, rescan_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.directory = Path(directory)
        self.stale_after_s = stale_after_s
        self.rescan_s = rescan_s
        self._clock = clock
        self._seen: dict[str, _Seen] = {}
        self._last_scan = float("-inf")
        self._lock = threading.Lock()

    def _scan(self, now: float) -> None:
        for path, rec in scan_endpoints(self.directory, "infer-*.json"):
            if rec.role not in (None, "infer") or not rec.url:
                continue
            seen = self._seen.get(path.name)
            if seen is None or seen.heartbeat != rec.heartbeat or seen.url != rec.url:
                self._seen[path.name] = _Seen(rec.heartbeat, now, rec.url)
        present = {p.name for p in self.directory.glob("infer-*.json")}
        for name in list(self._seen):
            if name not in present:
                del self._seen[name]

    def live(self) -> list[str]:
        now = self._clock()
        with self._lock:
            if now - self._last_scan >= self.rescan_s:
                self._scan(now)
                self._last_scan = now
            return sorted({s.url for s in self._seen.values() if now - s.changed_at <= self.stale_after_s})
