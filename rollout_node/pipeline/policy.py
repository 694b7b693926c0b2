"""What the RUN stage hands a policy, and what it gets back.

A policy (the LLM agent loop, or :class:`~rollout_node.pipeline.scripted.ScriptedPolicy`) drives
one episode in an open sandbox. Guarantees the pipeline relies on:

- The policy records tokens into ``ctx.transcript`` as it goes (token-in/token-out: IDs exactly as
  the engine saw and produced them), so even an episode aborted from outside leaves a valid,
  aligned record.
- It stops by itself when ``ctx.should_stop()`` turns true (deadline, cancellation, drain) and
  uses ``ctx.tool_timeout_s()`` for its tool calls, so a hung tool never outlives the RUN deadline.
- Infrastructure faults surface as exceptions (:class:`~hpc.errors.SandboxError`,
  :class:`~hpc.errors.InferenceError`); everything the agent does wrong is data.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from hpc.trajectory import Status
from rollout_node.agent.tools import SandboxLike
from rollout_node.pipeline.claim import Claim
from rollout_node.tasks.instance import TaskInstance


@dataclass
class Transcript:
    """Aligned per-token arrays built turn by turn (appends only)."""

    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    policy_versions: list[int] = field(default_factory=list)
    prompt_len: int = 0
    _min_version: int | None = None

    def add_context(self, ids: Sequence[int]) -> None:
        """Tokens the policy did not generate (prompt, observations, template pieces)."""
        if not self.token_ids:
            self.prompt_len = len(ids)
        self.token_ids.extend(int(i) for i in ids)
        self.loss_mask.extend([0] * len(ids))
        self.logprobs.extend([0.0] * len(ids))
        self.policy_versions.extend([-1] * len(ids))

    def add_generated(self, ids: Sequence[int], logprobs: Sequence[float], versions: Sequence[int]) -> None:
        """Tokens sampled from the policy, with their behaviour logprobs and policy versions."""
        assert len(ids) == len(logprobs) == len(versions), "generated arrays must align"
        if not self.token_ids:
            self.prompt_len = 0
        self.token_ids.extend(int(i) for i in ids)
        self.loss_mask.extend([1] * len(ids))
        self.logprobs.extend(float(x) for x in logprobs)
        self.policy_versions.extend(int(v) for v in versions)
        if versions:
            low = min(int(v) for v in versions)
            self._min_version = low if self._min_version is None else min(self._min_version, low)

    def note_versions(self, versions: Sequence[int]) -> None:
        """Versions of tokens generated elsewhere (the agent loop keeps its own lists until the end)."""
        if versions:
            low = min(int(v) for v in versions)
            self._min_version = low if self._min_version is None else min(self._min_version, low)

    def min_version(self) -> int | None:
        """The oldest policy version among the generated tokens (what staleness is measured on)."""
        return self._min_version

    def replace(self, other: Transcript) -> None:
        """Adopt a complete record built elsewhere (e.g. by the agent loop)."""
        self.token_ids, self.loss_mask = list(other.token_ids), list(other.loss_mask)
        self.logprobs, self.policy_versions = list(other.logprobs), list(other.policy_versions)
        self.prompt_len = other.prompt_len
        generated = [v for v in self.policy_versions if v >= 0]
        self._min_version = min(generated) if generated else None


class EpisodeSandbox(SandboxLike, Protocol):
    """The open sandbox an episode runs in (:class:`rollout_node.sandbox.Sandbox`): the agent's tools, plus
    what the pipeline asks of it."""

    def close(self) -> None:
        """Kill every process of the sandbox (idempotent; an abort calls it from another thread)."""

    @property
    def disk_verdict(self) -> str:
        """Why the episode's disk budget broke ('' while within it)."""


@dataclass
class EpisodeContext:
    """Everything one episode may use; built by the RUN stage."""

    task: TaskInstance            # the parsed task (parsed once, at claim time: pipeline.claim)
    claim: Claim                  # the claim it came from (``claim.fields``: the spool's task record as claimed)
    task_id: str
    sandbox: EpisodeSandbox       # open for the episode's RUN
    workdir: Path                 # host side of the sandbox's /work
    seed: int
    sample_index: int
    attempt: int
    deadline: float               # time.monotonic() at which RUN's time is up, before LLM waits
    command_timeout_s: float
    policy_version: Callable[[], int]
    transcript: Transcript = field(default_factory=Transcript)
    stop_event: threading.Event = field(default_factory=threading.Event)
    stop_reason: str | None = None
    llm_wait_s: float = 0.0       # time spent waiting for the inference server: not charged to RUN
    draining: Callable[[], bool] = lambda: False  # the node drains: an inference outage is not waited out

    def patient(self) -> bool:
        """May the episode wait for an inference server to come back (inference.outage_wait_s)?"""
        return not (self.stop_event.is_set() or self.draining())

    def effective_deadline(self) -> float:
        """RUN's deadline, moved by the time spent waiting for the inference server."""
        return self.deadline + self.llm_wait_s

    def remaining_s(self) -> float:
        return self.effective_deadline() - time.monotonic()

    def should_stop(self) -> bool:
        return self.stop_event.is_set() or self.remaining_s() <= 0

    def tool_timeout_s(self) -> float:
        """A tool call may take the configured time, but never past the episode's deadline."""
        return max(0.1, min(self.command_timeout_s, self.remaining_s()))


@dataclass
class EpisodeOutput:
    """How the policy ended the episode (the tokens are in ``ctx.transcript``)."""

    status: Status = Status.OK  # OK, TRUNCATED or TIMEOUT: the agent's own endings
    metrics: dict[str, Any] = field(default_factory=dict)
    sampling: dict[str, Any] = field(default_factory=dict)
    logprob_kind: str = "unknown"  # of the behaviour logprobs (hpc.trajectory.TRAINABLE_LOGPROB_KIND)
    # earlier segments of the episode, each with its own prompt (a harness that rewrote its history; the last
    # segment is ``ctx.transcript``): each becomes a trajectory of the same sample (Episode.trajectories)
    segments: list[Transcript] = field(default_factory=list)


class Policy(Protocol):
    """Drives one episode; called from many RUN worker threads at once."""

    def run_episode(self, ctx: EpisodeContext) -> EpisodeOutput: ...

    def close(self) -> None: ...


@runtime_checkable
class ReportsReadiness(Protocol):
    """A policy that can tell, before a claim, what it lacks to run an episode now (e.g.
    ``no_inference_server``: :class:`~rollout_node.pipeline.llm.LLMPolicy`); '' when ready."""

    def not_ready(self) -> str: ...
