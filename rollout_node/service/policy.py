"""The agent as the service runs it: the pipeline's :class:`~rollout_node.pipeline.llm.LLMPolicy`
(``rollout.policy: llm``) or :class:`~rollout_node.pipeline.harness.HarnessPolicy` (``rollout.policy:
harness``) with per-request ``sampling_params`` and a ProRL ``messages`` record, and an inference client
that balances new episodes to the least-assigned backend.

Guarantees:
- ``sampling_params`` of the spool task (checked by :mod:`rollout_node.service.wire`) override, for
  that episode only, ``temperature``, ``top_p``, ``max_iterations`` (agent turns) and
  ``max_output_tokens`` (tokens per generation); ``rollout.max_tokens`` and the server's context
  length still cap the episode.
- ``messages`` is built from the loop's own turn log: assistant ``token_ids``/``logprobs`` are the
  completion's, as the backend produced them (never decoded and encoded again), with the turn's
  ``prompt_len`` (its prompt is the trajectory's first ``prompt_len`` IDs: the answer cuts
  ``input_ids`` from there, so the shard stores no prompt twice); the text is decoded only for display.
- The harness (:class:`ServiceHarnessPolicy`): ``temperature``, ``top_p`` and ``max_output_tokens``
  set the episode's gateway session (``max_iterations`` is not honoured: the harness decides its
  turns). Its ``messages`` are read from the recorded segments, in order: each completion is an
  ``assistant`` message (``segment`` k, ``prompt_len`` within that segment, its ``token_ids`` and
  ``logprobs``), and the prompt tokens around them are ``context`` messages (the rendered text the
  model saw; the gateway keeps no copy of the harness's own message list).
- Balancing: an episode key (the task id) is assigned once, to the live backend with the fewest
  episodes assigned so far in this process, and keeps it for every turn (prefix cache) unless that
  backend fails or is cleared; then the next least-assigned live one takes over.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from typing import Any

from rollout_node.agent import AgentLimits
from rollout_node.agent.client import InferenceClient
from rollout_node.agent.result import EpisodeResult
from rollout_node.agent.template import ChatTemplate, Message
from rollout_node.agent.toolcall import ToolCall
from rollout_node.gateway.session import GatewaySampling
from rollout_node.pipeline.harness import HarnessPolicy
from rollout_node.pipeline.llm import LLMPolicy
from rollout_node.pipeline.policy import EpisodeContext, EpisodeOutput, Transcript

MAX_KEYS = 100_000  # assignments remembered (oldest forgotten first; a forgotten key is re-balanced)


class LeastAssignedClient(InferenceClient):
    """:class:`InferenceClient` whose ``pick`` is least-assigned + sticky instead of rendezvous."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._assigned: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._counts: collections.Counter[str] = collections.Counter()
        self._pick_lock = threading.Lock()

    def pick(self, key: str, exclude: str | None = None) -> str | None:
        live = [u for u in self.endpoints.live() if u != exclude] or self.endpoints.live()
        if not live:
            return None
        with self._pick_lock:
            current = self._assigned.get(key)
            if current in live and current != exclude:
                return current
            choice = min(live, key=lambda u: (not self.ready(u), self._counts[u], u))
            if current is not None:
                self._counts[current] -= 1
            self._assigned[key] = choice
            self._counts[choice] += 1
            while len(self._assigned) > MAX_KEYS:
                _, old = self._assigned.popitem(last=False)
                self._counts[old] -= 1
            return choice

    def assigned(self) -> dict[str, int]:
        with self._pick_lock:
            return {u: n for u, n in self._counts.items() if n > 0}


def messages_of(policy_template: ChatTemplate, opening: list[Message], result: EpisodeResult,
                observation_role: str) -> list[dict[str, Any]]:
    """ProRL's ``messages``: the ``opening`` ones (system, user), then per turn the assistant's generation
    and what answered it.

    An assistant turn that made a well-formed tool call carries ``tool_calls: [{"name", "arguments",
    "id"}]`` (ProRL's flattened form; ids ``call_1``, ``call_2``... in episode order, as NeMo Gym numbers
    them) and the observation that answers it is a ``tool`` message with that ``tool_call_id``; feedback
    on a turn without a usable call keeps ``observation_role`` (the role the model saw it as)."""
    out: list[dict[str, Any]] = [{"role": m.role, "content": m.content} for m in opening]
    calls = 0
    for turn in result.turns:
        c = turn.completion
        message: dict[str, Any] = {"role": "assistant", "content": policy_template.decode(c.token_ids),
                                   "token_ids": list(c.token_ids), "logprobs": list(c.logprobs),
                                   "prompt_len": turn.prompt_len, "finish_reason": c.finish_reason}
        answer: dict[str, Any] = {"role": observation_role, "content": turn.observation}
        if isinstance(turn.call, ToolCall):
            calls += 1
            message["tool_calls"] = [{"name": turn.call.name, "arguments": dict(turn.call.arguments),
                                      "id": f"call_{calls}"}]
            answer = {"role": "tool", "content": turn.observation, "tool_call_id": f"call_{calls}"}
        out.append(message)
        if turn.observation:
            out.append(answer)
    return out


class ServicePolicy(LLMPolicy):
    """``LLMPolicy`` plus per-request sampling and the ``messages`` record (module docstring), through
    the policy's extension points."""

    def episode_limits(self, ctx: EpisodeContext) -> AgentLimits:
        limits, params = self.loop.limits, dict(ctx.claim.fields.get("sampling_params") or {})
        return dataclasses.replace(
            limits, temperature=params.get("temperature", limits.temperature), top_p=params.get("top_p", limits.top_p),
            max_turns=params.get("max_iterations", limits.max_turns),
            max_new_tokens_per_turn=params.get("max_output_tokens", limits.max_new_tokens_per_turn))

    def episode_metrics(self, ctx: EpisodeContext, messages: list[Message], result: EpisodeResult,
                        limits: AgentLimits) -> dict[str, Any]:
        return {"service_messages": messages_of(self.template, messages, result, limits.observation_role)}


def segment_messages(template: ChatTemplate, segments: list[Transcript]) -> list[dict[str, Any]]:
    """ProRL ``messages`` of a harness episode from its segments, in order (module docstring): each run of
    generated tokens (mask 1) is one ``assistant`` message, each run of prompt tokens a ``context`` one."""
    out: list[dict[str, Any]] = []
    for k, seg in enumerate(segments):
        start = 0
        for end in range(1, len(seg.token_ids) + 1):
            if end < len(seg.token_ids) and seg.loss_mask[end] == seg.loss_mask[start]:
                continue
            ids = list(seg.token_ids[start:end])
            if seg.loss_mask[start]:
                out.append({"role": "assistant", "content": template.decode(ids), "token_ids": ids,
                            "logprobs": list(seg.logprobs[start:end]), "prompt_len": start, "segment": k})
            else:
                out.append({"role": "context", "content": template.decode(ids), "segment": k})
            start = end
    return out


class ServiceHarnessPolicy(HarnessPolicy):
    """``HarnessPolicy`` plus per-request sampling and the ``messages`` record (module docstring)."""

    def session_sampling(self, ctx: EpisodeContext) -> GatewaySampling:
        base, params = super().session_sampling(ctx), dict(ctx.claim.fields.get("sampling_params") or {})
        return dataclasses.replace(base, temperature=params.get("temperature", base.temperature),
                                   top_p=params.get("top_p", base.top_p),
                                   max_new_tokens=params.get("max_output_tokens", base.max_new_tokens))

    def run_episode(self, ctx: EpisodeContext) -> EpisodeOutput:
        out = super().run_episode(ctx)
        out.metrics["service_messages"] = segment_messages(self.template, [*out.segments, ctx.transcript])
        return out
