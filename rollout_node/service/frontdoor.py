"""The front door's state: the job table and its bridge to the run's spool.

One address, many nodes: each ``/process`` becomes one spool task (the instance inline, one
sample); any rollout node sharing the run directory claims it, and its trajectory comes back as a
shard row, which the front door claims as the spool's consumer, answers with, and commits.

Guarantees:
- Every job table change happens on the event loop; every spool call runs on ONE I/O thread (a
  ``Spool`` object belongs to one thread), batched per pump round: puts, cancel markers, one
  ``claim_shards`` and one ``commit``. No thread per request: a ``/process`` awaits its future.
- Several ``/process`` calls may share a ``job_id`` (a GRPO group): each is its own job (own task,
  own ``trajectory_id``); ``/cancel`` ends every one of them.
- A job ends exactly once: with its trajectory, cancelled (``/cancel``, ``/stop``) or timed out;
  a cancelled or timed-out job's task gets a cancel marker (its node stops it and closes its
  sandbox) and its late row is committed and counted, never answered twice.
- A node dying mid-job: its lease expires, another node reclaims the task and runs it again; the
  answer then says so (``attempt`` > 0 and ``previous_nodes``, the holders seen before). A second
  result of one task (a slow node past its lease) is dropped by the spool's dedup and counted.
  A job that times out names the node that held it last.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import socket
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpc.config import RunConfig
from hpc.paths import RunPaths
from hpc.spool import ConsumerSpool, Spool
from hpc.trajectory import Trajectory
from rollout_node.pipeline.control import cancel_dir, request_cancel
from rollout_node.service import wire

log = logging.getLogger("spoolrl.service")
HOLDERS_EVERY_S = 1.0
SHUTTING_DOWN = "server is shutting down; job cancelled"
# Nodes rescan RUN/endpoints at most every 1 s (EndpointDirectory.rescan_s): tasks submitted just
# after a backend change are held this long, so none of them runs on a backend already cleared.
SWAP_HOLD_S = 1.5


class JobEnded(Exception):
    """A job that ended without a trajectory: ``status`` is the HTTP status of the answer."""

    def __init__(self, status: int, message: str, body: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status, self.body = status, body


@dataclass(eq=False)
class Job:
    """One ``/process`` call; the calls of a group share ``job_id``, each has its own task and trajectory id."""

    job_id: str
    task_id: str
    trajectory_id: str
    instance: dict[str, Any]
    token_level: bool
    deadline: float
    future: asyncio.Future[dict[str, Any]]
    t0: float = field(default_factory=time.monotonic)
    holders: list[str] = field(default_factory=list)  # worker ids seen holding the task, in order
    parts: dict[int, Trajectory] = field(default_factory=dict)  # segment k -> its row, until all are in


@dataclass
class Round:
    """What one pump round hands the I/O thread, and what it brings back."""

    puts: list[dict[str, Any]] = field(default_factory=list)
    cancels: list[str] = field(default_factory=list)
    scan_holders: bool = False
    rows: list[Trajectory] = field(default_factory=list)
    duplicates: int = 0
    holders: dict[str, str] = field(default_factory=dict)


class FrontDoor:
    """The job table + spool pump behind the HTTP routes (see the module docstring)."""

    def __init__(self, paths: RunPaths, config: RunConfig, *, timeout_s: float, poll_s: float) -> None:
        self.paths, self.config = paths, config
        self.timeout_s, self.poll_s = timeout_s, poll_s
        self.consumer = f"raas-{socket.gethostname().split('.')[0]}-{os.getpid()}-{secrets.token_hex(2)}"
        self.io = ThreadPoolExecutor(1, thread_name_prefix="raas-spool")
        self.spool: ConsumerSpool | None = None
        self.jobs: dict[str, Job] = {}          # task id -> job
        self.by_job_id: dict[str, set[str]] = {}  # job id -> task ids (a group shares one job id)
        self.counts: Counter[str] = Counter()
        self.running = False
        self._round = Round()
        self._wake = asyncio.Event()
        self._last_holders = 0.0
        self._hold_until = 0.0
        self._pump: asyncio.Task[None] | None = None
        self._closing = False

    # ------------------------------------------------------------------ lifecycle
    async def open(self) -> None:
        self.spool = await self._io(self._open_spool)
        self._pump = asyncio.create_task(self._pump_loop(), name="raas-pump")

    def _open_spool(self) -> ConsumerSpool:
        spool = Spool(self.paths.root, self.config.spool)
        spool.fence(self.consumer)  # the only consumer of this run's shards from now on
        return spool

    async def close(self) -> None:
        """End every job, then let the pump flush what is queued (the ended jobs' cancel markers) and return.
        Never cancel the pump: a round it took would be lost with its flush, whose executor future a
        cancel drops before it starts (the nodes would run the ended episodes on to the drain deadline)."""
        self.fail_all(503, SHUTTING_DOWN)
        self._closing = True
        self._wake.set()
        if self._pump is not None and not self._pump.done():
            await self._pump
        elif self.spool is not None:
            await self._io(self._flush_round, self._take_round())
        self.io.shutdown(wait=True)

    async def _io(self, fn: Any, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.io, fn, *args)

    # ------------------------------------------------------------------ jobs
    def submit(self, job_id: str, instance: dict[str, Any], sampling: dict[str, Any]) -> Job:
        """Register a job (one more member of ``job_id``'s group) and queue its spool task for the next round."""
        task_id = f"raas-{secrets.token_hex(8)}"
        job = Job(job_id, task_id, self._trajectory_id(job_id, instance, task_id), instance,
                  bool(sampling["token_level_generation"]), time.monotonic() + self.timeout_s,
                  asyncio.get_running_loop().create_future())
        self.jobs[task_id] = job
        self.by_job_id.setdefault(job_id, set()).add(task_id)
        self._round.puts.append(wire.spool_task(task_id, job_id, instance, sampling))
        self.counts["submitted"] += 1
        self._wake.set()
        return job

    def _trajectory_id(self, job_id: str, instance: dict[str, Any], task_id: str) -> str:
        """The instance's ``trajectory_id``, made unique within its group; else the task id."""
        given = str(instance.get("trajectory_id") or "")
        taken = {self.jobs[t].trajectory_id for t in self.by_job_id.get(job_id, ()) if t in self.jobs}
        return task_id if not given else given if given not in taken else f"{given}:{task_id}"

    def cancel(self, job_id: str, reason: str) -> int:
        """End every job of ``job_id`` now as cancelled (answer 200, ``status: cancelled``); their nodes
        are told to stop them. Returns how many were in flight."""
        group = [self.jobs[t] for t in sorted(self.by_job_id.get(job_id, ())) if t in self.jobs]
        for job in group:
            self._end(job, JobEnded(200, reason, wire.failure(job.job_id, job.trajectory_id, job.instance, reason, None)))
        self.counts["cancelled"] += len(group)
        return len(group)

    def disconnected(self, job: Job) -> None:
        """The client of one call went away: stop that episode only (its group goes on)."""
        if self.jobs.get(job.task_id) is job:
            self._end(job, JobEnded(499, "client disconnected"))
            self.counts["cancelled"] += 1

    def fail_all(self, status: int, reason: str) -> int:
        jobs = list(self.jobs.values())
        for job in jobs:
            self._end(job, JobEnded(status, reason))
        self.counts["cancelled"] += len(jobs)
        return len(jobs)

    def _end(self, job: Job, outcome: JobEnded | dict[str, Any]) -> None:
        self.jobs.pop(job.task_id, None)
        group = self.by_job_id.get(job.job_id, set())
        group.discard(job.task_id)
        if not group:
            self.by_job_id.pop(job.job_id, None)
        if isinstance(outcome, JobEnded):
            self._round.cancels.append(job.task_id)
            self._wake.set()
            if not job.future.done():
                job.future.set_exception(outcome)
        elif not job.future.done():
            job.future.set_result(outcome)

    def backends_changed(self) -> None:
        """Hold new tasks until every node has seen the new backend list (see SWAP_HOLD_S)."""
        self._hold_until = time.monotonic() + SWAP_HOLD_S

    # ------------------------------------------------------------------ the pump
    async def _pump_loop(self) -> None:
        """Flush a round whenever woken (or every ``poll_s``); after :meth:`close`, one last round, then return."""
        while True:
            try:
                await asyncio.wait_for(self._wake.wait(), self.poll_s)
            except asyncio.TimeoutError:
                pass
            self._wake.clear()
            closing = self._closing  # read before the round is taken: it holds everything close() queued
            rnd = self._take_round()
            try:
                await self._io(self._flush_round, rnd)
            except Exception as exc:  # noqa: BLE001 - a spool fault fails this round's jobs, not the server
                log.exception("spool round failed")
                for task in rnd.puts:
                    if (job := self.jobs.get(task["task_id"])) is not None:
                        self._end(job, JobEnded(500, f"could not queue the task in the spool: {exc}"))
                if closing:
                    return
                continue
            self._settle(rnd)
            if closing:
                return

    def _take_round(self) -> Round:
        rnd, self._round = self._round, Round()
        now = time.monotonic()
        if now < self._hold_until:
            self._round.puts, rnd.puts = rnd.puts, []
        if now - self._last_holders >= HOLDERS_EVERY_S:
            rnd.scan_holders, self._last_holders = True, now
        return rnd

    def _flush_round(self, rnd: Round) -> None:
        """On the I/O thread: puts, cancel markers, read back finished rows, commit them."""
        assert self.spool is not None
        if rnd.puts:
            self.spool.put_tasks(rnd.puts)
        for task_id in rnd.cancels:
            request_cancel(self.paths, task_id)
        shards = self.spool.claim_shards(self.consumer, 256, if_changed=True)
        for shard in shards:
            rnd.rows.extend(shard.trajectories())
            rnd.duplicates += len(shard.dropped)
        if shards:
            self.spool.commit(self.consumer, [s.shard_id for s in shards])
        for traj in rnd.rows:
            (cancel_dir(self.paths) / traj.task_id).unlink(missing_ok=True)
        if rnd.scan_holders:
            rnd.holders = self.spool.task_holders()

    def _settle(self, rnd: Round) -> None:
        """On the loop: answer finished jobs, note holders, time jobs out."""
        self.counts["duplicates_dropped"] += rnd.duplicates
        for task_id, worker in rnd.holders.items():
            job = self.jobs.get(task_id)
            if job is not None and (not job.holders or job.holders[-1] != worker):
                job.holders.append(worker)
        for traj in rnd.rows:
            job = self.jobs.get(traj.task_id)
            if job is None:
                self.counts["late_results"] += 1  # cancelled or timed out before it came back
                continue
            if (segments := _segments(job, traj)) is not None:
                self._answer(job, segments[-1], segments[:-1])
        now = time.monotonic()
        for job in [j for j in self.jobs.values() if now > j.deadline]:
            held = f"; last held by node {job.holders[-1]}" if job.holders else "; no node had claimed it"
            self.counts["timed_out"] += 1
            message = f"job {job.job_id} passed the {self.timeout_s:g} s timeout and was cancelled{held}"
            body = {"detail": message, **wire.failure(job.job_id, job.trajectory_id, job.instance, message, "timeout")}
            self._end(job, JobEnded(504, message, body))

    def _answer(self, job: Job, traj: Trajectory, earlier: list[Trajectory]) -> None:
        writer = str(traj.metrics.get("node") or (job.holders[-1] if job.holders else ""))
        node = {"node": writer or None, "attempt": traj.attempt,
                "previous_nodes": [h for h in dict.fromkeys(job.holders) if h != writer]}
        if traj.attempt > 0:
            log.warning("job %s ran %d times (lease lost by %s)", job.job_id, traj.attempt + 1, node["previous_nodes"])
            self.counts["rerun_after_lost_lease"] += 1
        try:
            body = wire.result(traj, job.job_id, job.trajectory_id, job.instance, job.token_level,
                               time.monotonic() - job.t0, node, earlier)
        except ValueError as exc:  # a token record that breaks its own rules: never hand it to a trainer
            log.error("job %s: unusable token record: %s", job.job_id, exc)
            self.counts["failed"] += 1
            self._end(job, JobEnded(500, f"job {job.job_id}: the episode's token record is inconsistent ({exc})"))
            return
        self.counts["completed" if body["success"] else "failed"] += 1
        self._end(job, body)

    # ------------------------------------------------------------------ status
    def pending(self) -> int:
        return sum(1 for j in self.jobs.values() if not j.holders)

    def stage_counts(self) -> dict[str, int]:
        """Queues and busy workers summed over the nodes' latest metrics records."""
        total: Counter[str] = Counter()
        for path in (self.paths.metrics).glob("rollout-*.jsonl"):
            record = _last_record(path)
            if record is None:
                continue
            for stage in ("init", "run", "eval"):
                total[f"{stage}_queue"] += int(record.get("queue_depth", {}).get(stage, 0))
                total[f"active_{stage}"] += int(record.get("busy", {}).get(stage, 0))
        return {k: total.get(k, 0) for k in ("init_queue", "run_queue", "eval_queue",
                                            "active_init", "active_run", "active_eval")}


def _segments(job: Job, traj: Trajectory) -> list[Trajectory] | None:
    """The episode's rows in segment order once all of them are in (a one-segment episode: at once)."""
    if "segment" not in traj.metrics:
        return [traj]
    job.parts[int(traj.metrics["segment"])] = traj
    n = int(traj.metrics["segments_per_episode"])
    return [job.parts[k] for k in range(n)] if all(k in job.parts for k in range(n)) else None


def _last_record(path: Path, tail: int = 65536) -> dict[str, Any] | None:
    """The last ``node`` record of a node's metrics file (read from its tail only)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - tail))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("kind") == "node":
            return record
    return None
