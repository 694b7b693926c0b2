"""Rollout nodes present on a run: ``RUN/endpoints/rollout-node-<worker_id>.json``, the one reader/writer.

Why: the stop order. A rollout node writes its record when it starts and removes it only after its
drain released (or wrote) every task it held; an inference node that is asked to stop keeps serving
while such records exist (bounded by ``rollout.drain_timeout_s`` plus a margin), so draining episodes
get their answers instead of ending as ``inference_error``.

Record: ``{"role": "rollout", "worker_id", "host", "pid"}`` (atomic write). A record whose pid is
dead on the reader's own host is ignored (a SIGKILLed node cannot remove it); one of another host is
honoured until the reader's bound runs out (its pid means nothing here).
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

from hpc.fsutil import pid_alive, safe_name
from hpc.paths import RunPaths
from hpc.records import EndpointRecord, scan_endpoints, write_endpoint

PREFIX = "rollout-node-"
ROLE = "rollout"
DRAIN_MARGIN_S = 5.0  # what an inference node adds to rollout.drain_timeout_s while it waits


@dataclass(frozen=True)
class RolloutPresence:
    worker_id: str
    host: str
    pid: int


def this_host() -> str:
    return socket.gethostname().split(".")[0]


def presence_path(paths: RunPaths, worker_id: str) -> Path:
    return paths.endpoints / f"{PREFIX}{safe_name(worker_id)}.json"


def announce(paths: RunPaths, worker_id: str, pid: int) -> Path:
    """Write this node's record (call before the first claim)."""
    path = presence_path(paths, worker_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_endpoint(path, EndpointRecord(role=ROLE, host=this_host(), pid=pid, extra={"worker_id": worker_id}))
    return path


def withdraw(paths: RunPaths, worker_id: str) -> None:
    """Remove this node's record (call once nothing it claimed is held any more)."""
    presence_path(paths, worker_id).unlink(missing_ok=True)


def _presence(rec: EndpointRecord) -> RolloutPresence:
    return RolloutPresence(str(rec.extra.get("worker_id", "")), rec.host or "", rec.pid or 0)


def present(paths: RunPaths) -> list[RolloutPresence]:
    """Rollout nodes that may still hold tasks (dead pids of this host left out)."""
    host = this_host()
    found = []
    for _, rec in scan_endpoints(paths.endpoints, f"{PREFIX}*.json"):  # vanished ones: withdrawn meanwhile
        node = _presence(rec)
        if rec.role == ROLE and not (node.host == host and node.pid > 0 and not pid_alive(node.pid)):
            found.append(node)
    return found
