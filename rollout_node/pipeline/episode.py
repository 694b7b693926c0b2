"""The units the pipeline moves: a :class:`Group` (one claimed task, ``group_size`` samples) and an
:class:`Episode` (one attempt of one sample), plus the trajectory built from a finished episode.

Guarantees: an episode's stage clock starts when a worker picks it up, never when it is queued
(``enter``/``leave``), so timeouts count time inside a stage; ``abort`` is safe from any thread
and idempotent; every trajectory of a group shares the task id and one group id.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hpc.trajectory import Status, Trajectory
from rollout_node.pipeline.claim import Claim
from rollout_node.pipeline.evalshare import SharedEvals
from rollout_node.pipeline.policy import EpisodeContext, EpisodeOutput, Transcript
from rollout_node.tasks.instance import TaskInstance


@dataclass(eq=False)
class Group:
    """One claimed task and the results of its samples."""

    claim: Claim
    size: int
    image: str
    claimed_at: float = field(default_factory=time.monotonic)
    results: dict[int, Trajectory] = field(default_factory=dict)
    segments: dict[int, list[Trajectory]] = field(default_factory=dict)  # a sample's earlier segments
    live: set[Episode] = field(default_factory=set)
    closed: bool = False  # written or released: late reports are dropped
    started: bool = False  # an episode of it entered INIT (a drain releases unstarted groups at once)
    cancel: str | None = None
    evals: SharedEvals = field(default_factory=SharedEvals)  # one EVAL per distinct diff (rollout.eval_dedup)

    @property
    def task_id(self) -> str:
        return self.claim.task_id

    @property
    def task(self) -> TaskInstance:
        """The parsed task; a malformed claim's group is closed at claim time and never staged."""
        if self.claim.task is None:
            raise RuntimeError(f"task {self.task_id} is malformed ({self.claim.error}): it has no stages")
        return self.claim.task

    @property
    def group_id(self) -> str:
        return f"{self.task_id}:g"

    @property
    def complete(self) -> bool:
        return len(self.results) == self.size

    def rows(self) -> list[Trajectory]:
        """Every trajectory of the group in sample order, a sample's earlier segments before its last."""
        return [t for i in range(self.size) for t in (*self.segments.get(i, ()), self.results[i])]


@dataclass(eq=False)
class Episode:
    """One attempt of one sample of a group, as it moves INIT -> RUN -> EVAL."""

    group: Group
    sample_index: int
    attempt: int
    seed: int
    stage: str = "init_queue"
    last_stage: str = ""
    stage_t0: float = field(default_factory=time.monotonic)
    workdir: Path | None = None
    ctx: EpisodeContext | None = None
    output: EpisodeOutput | None = None
    transcript: Transcript = field(default_factory=Transcript)
    diff: str = ""
    abort_reason: str | None = None
    timings: dict[str, float] = field(default_factory=dict)
    metrics: dict[str, Any] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def key(self) -> str:
        return f"{self.group.task_id}-s{self.sample_index}-a{self.attempt}"

    def enter(self, stage: str) -> None:
        """A worker picked the episode up: the time queued is recorded, the stage clock starts."""
        now = time.monotonic()
        self.timings[f"{stage}_wait_s"] = round(now - self.stage_t0, 4)
        self.stage, self.stage_t0 = stage, now

    def leave(self, next_queue: str) -> float:
        """The stage is over; returns its duration."""
        now = time.monotonic()
        spent = now - self.stage_t0
        self.timings[f"{self.stage}_s"] = round(self.timings.get(f"{self.stage}_s", 0.0) + spent, 4)
        self.last_stage, self.stage, self.stage_t0 = self.stage, next_queue, now
        return spent

    def in_stage_s(self) -> float:
        return time.monotonic() - self.stage_t0

    def charged_s(self) -> float:
        """Time charged to the stage's limit: in RUN, time waiting for the inference server is not."""
        waited = self.ctx.llm_wait_s if self.ctx is not None and self.stage == "run" else 0.0
        return self.in_stage_s() - waited

    def abort(self, reason: str, *, hard: bool = True) -> None:
        """Stop the episode from another thread: ask the policy to stop, and (hard) kill its sandbox."""
        with self._lock:
            if self.abort_reason is None:
                self.abort_reason = reason
            ctx = self.ctx
        if ctx is None:
            return
        ctx.stop_reason = ctx.stop_reason or reason
        ctx.stop_event.set()
        if hard:
            try:
                ctx.sandbox.close()
            except Exception:  # noqa: BLE001 - closing a dying sandbox may fail; the worker cleans up
                pass

    def trajectories(self, status: Status, reward: float | None) -> list[Trajectory]:
        """The sample's record: one trajectory per segment (the policy's ``EpisodeOutput.segments``, then
        the transcript), all with this sample's index, status and reward (``metrics["segment"]`` = k of
        ``metrics["segments_per_episode"]``); the last segment keeps the sample's plain trajectory id."""
        segments = [*(self.output.segments if self.output is not None else []), self.transcript]
        if len(segments) == 1:
            return [self.trajectory(status, reward)]
        return [self.trajectory(status, reward, (k, len(segments), seg)) for k, seg in enumerate(segments)]

    def trajectory(self, status: Status, reward: float | None,
                   segment: tuple[int, int, Transcript] | None = None) -> Trajectory:
        """The record of this sample; infrastructure statuses never carry a reward.

        ``Trajectory.attempt`` is the task's lease attempt (the spool deduplicates by task id and
        (writer, attempt), so every sample of a group carries the same one); the sample's own retry
        count is ``metrics["sample_attempt"]`` (it is also an input of the sampling seed).
        """
        k, n, tr = segment if segment is not None else (0, 1, self.transcript)
        suffix = f":seg{k}" if k < n - 1 else ""
        out = self.output
        if not status.trainable:
            reward = None
        return Trajectory(
            trajectory_id=f"{self.group.task_id}:s{self.sample_index}:a{self.attempt}{suffix}",
            task_id=self.group.task_id, group_id=self.group.group_id, sample_index=self.sample_index,
            token_ids=np.asarray(tr.token_ids, np.int32), loss_mask=np.asarray(tr.loss_mask, np.int8),
            logprobs=np.asarray(tr.logprobs, np.float32), policy_versions=np.asarray(tr.policy_versions, np.int32), logprob_kind=out.logprob_kind if out else "unknown",
            reward=reward, status=status, timings=dict(self.timings),
            metrics={**(out.metrics if out else {}), **self.metrics, "sample_attempt": self.attempt,
                     **({} if n == 1 else {"segment": k, "segments_per_episode": n})},
            sampling={"seed": self.seed, "sample_attempt": self.attempt, **(out.sampling if out else {})},
            attempt=self.group.claim.attempt, prompt_len=tr.prompt_len,
            task_version=self.group.claim.record.task_version,
        )
