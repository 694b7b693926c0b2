"""The LLM agent as a pipeline policy: :class:`rollout_node.agent.AgentLoop` against the run's
inference servers (``RUN/endpoints/``), in the episode's sandbox.

Guarantees: one :class:`~rollout_node.agent.client.InferenceClient` per node, shared by every RUN
thread; the samples of one task share a session key, so they stick to one server (prefix cache);
the loop's token budget is capped by the servers' context length (read once they are live, so an
episode that reaches it ends as ``truncated``, not as an inference error); the loop gets the
episode's deadline (time waiting for the server is not charged) and the pipeline's stop request (cancellation, staleness,
drain); the versions of generated tokens are passed to the transcript as they arrive, so the
staleness check sees a running episode; the final record is the loop's own token lists
(token-in/token-out, never re-tokenized). The loop's ``inference_error``/``sandbox_error`` stops
come back as statuses, which the stages map to the fault table's rows.

Extension points (for a policy that runs the same episode with per-episode settings, e.g. the
rollout service's :class:`~rollout_node.service.policy.ServicePolicy`): :meth:`LLMPolicy.episode_limits`
gives the episode's agent limits, :meth:`LLMPolicy.episode_metrics` adds metrics to its record. The
loop, the transcript and the stop rules stay this module's.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpc.config import RunConfig
from hpc.paths import RunPaths
from rollout_node.agent import (
    SYSTEM_PROMPTS,
    AgentLimits,
    AgentLoop,
    ChatTemplate,
    Completion,
    EpisodeSeed,
    SamplingParams,
    SandboxTools,
    task_messages,
)
from rollout_node.agent.client import EpisodeSession, InferenceClient
from rollout_node.agent.result import EpisodeResult
from rollout_node.agent.template import Message
from rollout_node.pipeline.policy import EpisodeContext, EpisodeOutput, Transcript


def tokenizer_dir(paths: RunPaths, config: RunConfig) -> Path:
    return paths.tokenizer_dir(config.model.path, config.model.tokenizer_path)


class VersionTap:
    """Forwards ``generate``, tells the transcript the versions of the tokens just generated, and
    books the time spent waiting for the server on the episode (it is not charged to RUN's limit)."""

    def __init__(self, session: EpisodeSession, ctx: EpisodeContext) -> None:
        self.session, self.ctx = session, ctx

    def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Completion:
        t0 = time.monotonic()
        try:
            completion = self.session.generate(prompt_ids, sampling)
        finally:
            self.ctx.llm_wait_s += time.monotonic() - t0
        self.ctx.transcript.note_versions(completion.versions)
        return completion


class LLMPolicy:
    """``rollout.policy: llm`` (see the module docstring)."""

    def __init__(self, paths: RunPaths, config: RunConfig, *, client: InferenceClient | None = None,
                 template: ChatTemplate | None = None) -> None:
        self.template = template or ChatTemplate.from_model_dir(tokenizer_dir(paths, config))
        self.client = client or InferenceClient.from_config(config.inference, run_dir=paths.root)
        self.loop = AgentLoop(self.template, AgentLimits.from_config(config.rollout, config.inference))
        self.run_seed = config.run.seed
        self.system = SYSTEM_PROMPTS[config.rollout.system_prompt]
        self._context_known = False

    def close(self) -> None:
        self.client.close()

    def not_ready(self) -> str:
        """Why the node should not claim now ('' = ready): no live inference server is announced yet."""
        return "" if self.client.endpoints.live() else "no_inference_server"

    def _learn_context_len(self) -> None:
        """Once the servers are up: their context length bounds every episode (a longer prompt would
        be a 400, an *infrastructure* error; an episode that reaches it ends as ``truncated`` instead)."""
        if self._context_known:
            return
        n = self.client.max_model_len()
        if n is not None:
            self.loop.limits = dataclasses.replace(self.loop.limits, context_len=n)
            self._context_known = True

    def episode_limits(self, ctx: EpisodeContext) -> AgentLimits:
        """Extension point: the agent limits of this episode. The default is the run's (``rollout.*``,
        with the servers' context length once known); an override starts from ``self.loop.limits``."""
        return self.loop.limits

    def episode_metrics(self, ctx: EpisodeContext, messages: list[Message], result: EpisodeResult,
                        limits: AgentLimits) -> dict[str, Any]:
        """Extension point: metrics added to the episode's record, from the opening ``messages``, the
        loop's ``result`` and the ``limits`` it ran with (the default adds none)."""
        return {}

    def run_episode(self, ctx: EpisodeContext) -> EpisodeOutput:
        self._learn_context_len()
        limits = self.episode_limits(ctx)
        loop = self.loop.with_limits(limits)
        policy = VersionTap(self.client.session(ctx.task_id, ctx.patient, ctx.stop_event.is_set), ctx)
        tools = SandboxTools(ctx.sandbox, timeout_s=ctx.tool_timeout_s)  # never past the RUN deadline
        seed = EpisodeSeed(self.run_seed, ctx.task_id, ctx.sample_index, ctx.attempt)
        messages = task_messages(ctx.task.problem_statement or ctx.task_id, system=self.system)
        result = loop.run(messages, policy, tools, seed=seed, cancel=lambda _so_far: _stop_reason(ctx),
                          deadline=ctx.effective_deadline)
        ctx.transcript.replace(Transcript(token_ids=result.token_ids, loss_mask=result.loss_mask,
                                          logprobs=result.logprobs, policy_versions=result.policy_versions,
                                          prompt_len=result.prompt_len))
        metrics = {**result.metrics(), **{f"agent_{k}": round(v, 4) for k, v in result.timings.items()},
                   **self.episode_metrics(ctx, messages, result, limits)}
        return EpisodeOutput(status=result.status, metrics=metrics, sampling=dict(result.sampling),
                             logprob_kind=result.logprob_kind)


def _stop_reason(ctx: EpisodeContext) -> str | None:
    return (ctx.stop_reason or "stopped") if ctx.stop_event.is_set() else None
