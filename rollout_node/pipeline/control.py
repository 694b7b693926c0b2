"""What a rollout node reads from outside while it runs: control files, the policy version, the clock.

Control files (all under ``RUN/control/``; any process on any node may create them):

- ``STOP``: every rollout node drains (no new claims, in-flight groups finish or are released)
  and exits.
- ``cancel/<task_id>``: the task is cancelled: in-flight samples are stopped, their sandboxes
  closed, and the group is written with status ``cancelled``; a task claimed later with that id
  is written as cancelled at once.
- ``TRAINER_WAITING`` (:class:`hpc.records.TrainerWaiting`, written by the trainer): the trainer is
  blocked waiting for samples; the node seals its open shard at once, and every group it writes
  while the marker stands (:mod:`~rollout_node.pipeline.sink`), instead of at ``spool.shard_max_age_s``.

The policy version is ``RUN/policy/LATEST`` (missing = version 0). The job's remaining time comes
from :class:`hpc.slurm_env.SlurmEnv` (``SLURM_JOB_END_TIME``, else ``squeue``), refreshed at most
once a minute because ``squeue`` is a controller RPC. Reads are throttled to the spool's poll
interval: at a thousand nodes these directories are listed often.
"""

from __future__ import annotations

import time
from pathlib import Path

from hpc.errors import RecordError
from hpc.paths import RunPaths
from hpc.records import read_policy_latest, trainer_waiting
from hpc.slurm_env import SlurmEnv

CANCEL_DIR = "cancel"


def cancel_dir(paths: RunPaths) -> Path:
    return paths.control / CANCEL_DIR


def request_cancel(paths: RunPaths, task_id: str) -> Path:
    """Create the cancel marker of one task (what ``spoolrl`` users or the trainer call)."""
    marker = cancel_dir(paths) / task_id
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.touch()
    return marker


class ControlFiles:
    """Throttled reads of STOP, the cancel markers, TRAINER_WAITING and policy/LATEST."""

    def __init__(self, paths: RunPaths, poll_s: float) -> None:
        self.paths = paths
        self.poll_s = poll_s
        self._next = 0.0
        self._stop = False
        self._trainer_waiting = False
        self._cancelled: frozenset[str] = frozenset()
        self._latest = 0

    def refresh(self, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now < self._next:
            return
        self._next = now + self.poll_s
        self._stop = self.paths.stop_marker.exists()
        self._trainer_waiting = trainer_waiting(self.paths)
        try:
            self._cancelled = frozenset(p.name for p in cancel_dir(self.paths).iterdir())
        except FileNotFoundError:
            self._cancelled = frozenset()
        self._latest = read_latest(self.paths)

    @property
    def stop(self) -> bool:
        return self._stop

    @property
    def trainer_waiting(self) -> bool:
        """The trainer waits for samples (as of the last refresh): seal shards now."""
        return self._trainer_waiting

    @property
    def latest_version(self) -> int:
        return self._latest

    def cancelled(self, task_id: str) -> bool:
        return task_id in self._cancelled


def read_latest(paths: RunPaths) -> int:
    """The current policy version (0 before the first publish)."""
    try:
        return read_policy_latest(paths) or 0
    except RecordError:
        return 0


class JobClock:
    """Seconds left before Slurm ends the job (None outside Slurm or without a limit)."""

    def __init__(self, env: SlurmEnv | None = None, refresh_s: float = 60.0) -> None:
        self.env = env or SlurmEnv.from_environ()
        self.refresh_s = refresh_s
        self._end: float | None = None
        self._next = 0.0

    def remaining_s(self) -> float | None:
        now = time.monotonic()
        if now >= self._next:
            self._next = now + self.refresh_s
            self._end = self.env.end_time(squeue=self.env.in_slurm)
        return None if self._end is None else max(0.0, self._end - time.time())
