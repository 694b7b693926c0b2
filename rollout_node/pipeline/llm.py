"""The LLM agent as a pipeline policy: :class:`rollout_node.agent.AgentLoop` against the run's
inference servers (``RUN/endpoints/``), in the episode's sandbox.

Guarantees: one :class:`~rollout_node.agent.client.InferenceClient` per node, shared by every RUN
thread; the samples of one task share a session key, so they stick to one server (prefix cache);
the loop gets the episode's deadline and the pipeline's stop request (cancellation, staleness,
drain); the versions of generated tokens are passed to the transcript as they arrive, so the
staleness check sees a running episode; the final record is the loop's own token lists
(token-in/token-out, never re-tokenized). The loop's ``inference_error``/``sandbox_error`` stops
come back as statuses, which the stages map to the fault table's rows.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hpc.config import RunConfig
from hpc.paths import RunPaths
from rollout_node.agent import (
    AgentLimits,
    AgentLoop,
    ChatTemplate,
    Completion,
    EpisodeSeed,
    SamplingParams,
    SandboxTools,
    task_messages,
)
from rollout_node.pipeline.policy import EpisodeContext, EpisodeOutput, Transcript


def tokenizer_dir(paths: RunPaths, config: RunConfig) -> Path:
    if config.model.tokenizer_path:
        return Path(config.model.tokenizer_path)
    return paths.model if config.model.path == "tiny" else Path(config.model.path)


class _VersionTap:
    """Forwards ``generate`` and tells the transcript the versions of the tokens just generated."""

    def __init__(self, session: Any, transcript: Transcript) -> None:
        self.session, self.transcript = session, transcript

    def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Completion:
        completion: Completion = self.session.generate(prompt_ids, sampling)
        self.transcript.note_versions(completion.versions)
        return completion


class LLMPolicy:
    """``rollout.policy: llm`` (see the module docstring)."""

    def __init__(self, paths: RunPaths, config: RunConfig, *, client: Any = None,
                 template: ChatTemplate | None = None) -> None:
        from rollout_node.agent.client import InferenceClient

        self.template = template or ChatTemplate.from_model_dir(tokenizer_dir(paths, config))
        self.client = client or InferenceClient.from_config(config.inference, run_dir=paths.root)
        r, inf = config.rollout, config.inference
        self.loop = AgentLoop(self.template, AgentLimits(
            max_turns=r.max_turns, max_tokens=r.max_tokens, max_new_tokens_per_turn=r.max_new_tokens_per_turn,
            observation_max_tokens=r.observation_max_tokens, temperature=inf.temperature, top_p=inf.top_p))
        self.run_seed = config.run.seed

    def close(self) -> None:
        self.client.close()

    def not_ready(self) -> str:
        """Why the node should not claim now ('' = ready): no live inference server is announced yet."""
        return "" if self.client.endpoints.live() else "no_inference_server"

    def run_episode(self, ctx: EpisodeContext) -> EpisodeOutput:
        policy = _VersionTap(self.client.session(ctx.task_id), ctx.transcript)
        tools = SandboxTools(ctx.sandbox, timeout_s=ctx.tool_timeout_s)  # never past the RUN deadline
        seed = EpisodeSeed(self.run_seed, ctx.task_id, ctx.sample_index, ctx.attempt)
        result = self.loop.run(task_messages(ctx.task.problem_statement or ctx.task_id), policy, tools, seed=seed,
                               cancel=lambda _so_far: _stop_reason(ctx),
                               deadline=ctx.deadline)
        ctx.transcript.replace(Transcript(token_ids=result.token_ids, loss_mask=result.loss_mask,
                                          logprobs=result.logprobs, policy_versions=result.policy_versions,
                                          prompt_len=result.prompt_len))
        metrics = {**result.metrics(), **{f"agent_{k}": round(v, 4) for k, v in result.timings.items()}}
        return EpisodeOutput(status=result.status, metrics=metrics, sampling=dict(result.sampling))


def _stop_reason(ctx: EpisodeContext) -> str | None:
    return (ctx.stop_reason or "stopped") if ctx.stop_event.is_set() else None
