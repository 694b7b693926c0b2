"""What a rollout node wrote, read back from the spool (shared by the pipeline tests)."""

from __future__ import annotations

from typing import Any

from hpc.paths import RunPaths
from hpc.spool import Spool
from hpc.trajectory import Trajectory


def written(paths: RunPaths, cfg: Any) -> dict[str, list[Trajectory]]:
    """task id -> the trajectories of every ready shard (claimed by a test reader)."""
    out: dict[str, list[Trajectory]] = {}
    for shard in Spool(paths.root, cfg.spool).claim_shards("test-reader", 10_000):
        for t in shard.trajectories():
            out.setdefault(t.task_id, []).append(t)
    return out
