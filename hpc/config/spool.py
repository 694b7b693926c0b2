"""Spool settings: shard sealing, leases, polling and backpressure."""

from __future__ import annotations

from hpc.config.base import knob, section


@section
class SpoolConfig:
    """The shared-filesystem queue between rollout and training."""

    shard_max_trajectories: int = knob(
        128, doc="seal a shard after this many trajectories (fewer, larger shards: fewer metadata operations)", min=1)
    shard_max_mb: float = knob(64.0, doc="seal a shard once its encoded size passes this many MB", min=0.001)
    shard_max_age_s: float = knob(30.0, doc="seal an open shard that is older than this", min=0.1)
    lease_s: float = knob(
        600.0, doc="a task or shard claim expires when its heartbeat has not changed for this long", min=1.0,
        resumable=True,
    )
    heartbeat_interval_s: float = knob(10.0, doc="how often claimers bump their heartbeat counter", min=0.1,
                                       resumable=True)
    poll_interval_s: float = knob(
        1.0, doc="how often idle readers list the spool (with +-20% jitter); at least 1 s on shared filesystems",
        min=0.05, resumable=True,
    )
    max_ready_shards: int = knob(
        32, doc="backpressure: rollout nodes stop claiming tasks while this many shards wait unconsumed", min=1,
        resumable=True,
    )

    def check(self) -> list[str]:
        if self.heartbeat_interval_s * 2 > self.lease_s:
            return [f"heartbeat_interval_s: {self.heartbeat_interval_s} must be at most half of lease_s "
                    f"({self.lease_s}); lower it or raise lease_s"]
        return []
