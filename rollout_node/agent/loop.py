"""The token-exact multi-turn agent loop.

Each turn: prompt = previous prompt IDs + generated IDs (+ mask-0 end-of-turn IDs when the engine
stopped without ``<|im_end|>``) + the new observation's IDs, i.e. ``"\\n"`` after ``<|im_end|>``,
``<|im_start|>ROLE\\n``, the observation text tokenized ALONE (and truncated by a token budget),
``<|im_end|>\\n`` and ``<|im_start|>assistant\\n`` (pieces from :mod:`rollout_node.agent.template`).
The conversation text is never decoded and encoded again; the generated text is decoded only to
parse the tool call, and those IDs stay as generated.

Guarantees:
- The loop never raises for an episode's own failure: no server (``InferenceError``) ->
  ``inference_error``; a broken sandbox (``SandboxError``) -> ``sandbox_error``; both stop the
  episode with the tokens so far. Stops: ``submit`` (status ok), ``max_turns``, ``max_tokens`` and
  ``context`` (status truncated), ``cancelled``, ``timeout``.
- The sequence never exceeds ``min(max_tokens, context_len)``: each request asks for at most the
  room left minus one (kept for an appended ``<|im_end|>``), and an observation that does not fit
  ends the episode instead of being sent.
- Work per turn is O(new tokens): the token lists only grow in place and the policy gets the list
  itself (the policy contract forbids mutating it).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hpc.config import InferenceConfig, RolloutConfig
from hpc.errors import InferenceError, SandboxError
from hpc.trajectory import Status
from rollout_node.agent.policy import Completion, Policy, SamplingParams
from rollout_node.agent.result import EpisodeResult, TurnRecord
from rollout_node.agent.seeds import EpisodeSeed
from rollout_node.agent.template import ChatTemplate, Message
from rollout_node.agent.toolcall import ParseError, ToolCall, parse_tool_call
from rollout_node.agent.tools import ToolOutput, Tools

_ROLLOUT, _INFERENCE = RolloutConfig(), InferenceConfig()  # the defaults, stated once in hpc/config


@dataclass(frozen=True)
class AgentLimits:
    """The agent's budget and sampling (built from RolloutConfig + InferenceConfig by the pipeline).

    A field left out takes the config's default (``rollout.*`` / ``inference.*``), never a second copy."""

    max_turns: int = _ROLLOUT.max_turns
    max_tokens: int = _ROLLOUT.max_tokens
    max_new_tokens_per_turn: int = _ROLLOUT.max_new_tokens_per_turn
    observation_max_tokens: int = _ROLLOUT.observation_max_tokens
    context_len: int | None = None   # the engine's max model length, when known
    temperature: float = _INFERENCE.temperature
    top_p: float = _INFERENCE.top_p
    observation_role: str = "user"   # the role tool output is sent as (not a config knob)

    @classmethod
    def from_config(cls, rollout: RolloutConfig, inference: InferenceConfig, *,
                    context_len: int | None = None) -> AgentLimits:
        """From ``RolloutConfig`` + ``InferenceConfig`` (and the servers' ``max_model_len``, when known)."""
        return cls(max_turns=rollout.max_turns, max_tokens=rollout.max_tokens,
                   max_new_tokens_per_turn=rollout.max_new_tokens_per_turn,
                   observation_max_tokens=rollout.observation_max_tokens, context_len=context_len,
                   temperature=inference.temperature, top_p=inference.top_p)

    @property
    def budget(self) -> int:
        return min(self.max_tokens, self.context_len or self.max_tokens)

    @property
    def budget_reason(self) -> str:
        return "context" if self.context_len and self.context_len < self.max_tokens else "max_tokens"


class _Episode:
    """The mutable state of one episode: four aligned token lists plus the turn log."""

    def __init__(self, template: ChatTemplate, first_prompt: list[int]) -> None:
        n = len(first_prompt)
        self.template = template
        self.result = EpisodeResult(token_ids=first_prompt, loss_mask=[0] * n, logprobs=[0.0] * n,
                                    policy_versions=[-1] * n, prompt_len=n)

    @property
    def ids(self) -> list[int]:
        return self.result.token_ids

    def add_context(self, ids: Sequence[int]) -> None:
        r = self.result
        r.token_ids.extend(ids)
        r.loss_mask.extend([0] * len(ids))
        r.logprobs.extend([0.0] * len(ids))
        r.policy_versions.extend([-1] * len(ids))

    def add_generated(self, c: Completion) -> bool:
        """Append a completion; returns True when ``<|im_end|>`` had to be appended (mask 0)."""
        r = self.result
        r.token_ids.extend(c.token_ids)
        r.loss_mask.extend([1] * len(c.token_ids))
        r.logprobs.extend(c.logprobs)
        r.policy_versions.extend(c.versions)
        if c.token_ids and c.token_ids[-1] == self.template.im_end:
            return False
        self.add_context([self.template.im_end])
        return True

    def stop(self, reason: str, status: Status, error: str = "") -> None:
        self.result.stop_reason, self.result.status, self.result.error = reason, status, error


def truncate_ids(ids: list[int], budget: int, marker: Sequence[int]) -> tuple[list[int], bool]:
    """Keep the head and the tail of ``ids`` around ``marker`` so the total fits ``budget``."""
    if len(ids) <= budget:
        return ids, False
    keep = max(budget - len(marker), 0)
    head, tail = keep // 2, keep - keep // 2
    return ids[:head] + list(marker) + (ids[-tail:] if tail else []), True


def format_observation(call: ToolCall | ParseError, out: ToolOutput | None) -> tuple[str, str, str]:
    """(header, body, footer) of an observation; only the body is subject to token truncation."""
    if isinstance(call, ParseError):
        return "", f"error: {call.message}", ""
    assert out is not None
    notes = []
    if out.timed_out:
        notes.append("timed out")
    elif out.exit_code is not None and out.exit_code != 0:
        notes.append(f"exit code {out.exit_code}")
    if out.truncated:
        notes.append("output truncated by the sandbox")
    if call.note:
        notes.append(call.note)
    footer = f"\n[{'; '.join(notes)}]" if notes else ""
    return "", out.text, footer


class AgentLoop:
    """Runs episodes with one template and limits; thread-safe (no per-episode state on self)."""

    TRUNCATION_MARKER = "\n[... output truncated ...]\n"

    def __init__(self, template: ChatTemplate, limits: AgentLimits) -> None:
        self.template = template
        self.limits = limits
        self.marker_ids = template.encode_content(self.TRUNCATION_MARKER)

    def with_limits(self, limits: AgentLimits) -> AgentLoop:
        """This loop with other limits (the template and its encoded marker shared; ``self`` unchanged)."""
        loop = copy.copy(self)
        loop.limits = limits
        return loop

    def observation_ids(self, call: ToolCall | ParseError, out: ToolOutput | None) -> tuple[list[int], bool]:
        """``\\n`` + ``<|im_start|>ROLE\\n`` + content + ``<|im_end|>\\n`` + ``<|im_start|>assistant\\n``."""
        t = self.template
        header, body, footer = format_observation(call, out)
        body_ids, truncated = truncate_ids(t.encode_content(body), self.limits.observation_max_tokens, self.marker_ids)
        content = (t.encode_content(header) if header else []) + body_ids + (t.encode_content(footer) if footer else [])
        ids = [*t.after_end_of_turn, *t.message_ids(self.limits.observation_role, content), *t.generation_prompt]
        return ids, truncated

    def sampling(self, room: int, seed: EpisodeSeed | None, turn: int) -> SamplingParams:
        lim = self.limits
        return SamplingParams(max_tokens=min(lim.max_new_tokens_per_turn, room), temperature=lim.temperature,
                              top_p=lim.top_p, seed=seed.for_turn(turn) if seed else None,
                              stop_token_ids=tuple(self.template.stop_token_ids))

    def run(self, messages: Sequence[Message], policy: Policy, tools: Tools, *, seed: EpisodeSeed | None = None,
            cancel: Callable[[EpisodeResult], str | None] | None = None,
            deadline: float | Callable[[], float] | None = None) -> EpisodeResult:
        """Run one episode from ``messages`` (system + task) until a stop; see the module docstring.

        ``cancel(result_so_far)`` is asked before every generation; a reason string stops the episode
        as ``cancelled`` (e.g. too stale: ``hpc.trajectory.staleness(v, result.policy_versions)``).
        ``deadline`` is a ``time.monotonic()`` instant (or a callable giving it, for a deadline that
        moves, e.g. one that does not count time spent waiting for the server); past it the episode
        stops as ``timeout``.
        """
        t_start = time.perf_counter()
        ep = _Episode(self.template, self.template.first_prompt(messages))
        ep.result.sampling = {"temperature": self.limits.temperature, "top_p": self.limits.top_p,
                              "max_new_tokens_per_turn": self.limits.max_new_tokens_per_turn,
                              "seed": None if seed is None else vars(seed)}
        gen_s = tool_s = 0.0
        for turn in range(self.limits.max_turns):
            if self._interrupted(ep, cancel, deadline):
                break
            record = self._generate(ep, policy, seed, turn)
            if record is None:
                break
            gen_s += record.generate_s
            done = self._act(ep, record, tools, last_turn=turn == self.limits.max_turns - 1)
            tool_s += record.tool_s
            if done:
                break
        total = time.perf_counter() - t_start
        ep.result.timings = {"total_s": total, "generate_s": gen_s, "tool_s": tool_s,
                             "overhead_s": max(total - gen_s - tool_s, 0.0)}
        return ep.result

    def _interrupted(self, ep: _Episode, cancel: Callable[[EpisodeResult], str | None] | None,
                     deadline: float | Callable[[], float] | None) -> bool:
        reason = cancel(ep.result) if cancel else None
        if reason:
            ep.stop("cancelled", Status.CANCELLED, reason)
            return True
        if deadline is not None and time.monotonic() >= (deadline() if callable(deadline) else deadline):
            ep.stop("timeout", Status.TIMEOUT, "episode time limit reached")
            return True
        return False

    def _generate(self, ep: _Episode, policy: Policy, seed: EpisodeSeed | None, turn: int) -> TurnRecord | None:
        room = self.limits.budget - len(ep.ids) - 1  # one token kept for an appended <|im_end|>
        if room < 1:
            ep.stop(self.limits.budget_reason, Status.TRUNCATED)
            return None
        sampling = self.sampling(room, seed, turn)
        prompt_len = len(ep.ids)
        t0 = time.perf_counter()
        try:
            completion = policy.generate(ep.ids, sampling)
        except InferenceError as exc:
            ep.stop("inference_error", Status.INFERENCE_ERROR, str(exc))
            return None
        if len(completion.token_ids) > sampling.max_tokens:
            ep.stop("inference_error", Status.INFERENCE_ERROR,
                    f"engine returned {len(completion.token_ids)} tokens for max_tokens={sampling.max_tokens}")
            return None
        record = TurnRecord(turn=turn, prompt_len=prompt_len, sampling=sampling, completion=completion,
                            generate_s=time.perf_counter() - t0)
        record.eot_appended = ep.add_generated(completion)
        ep.result.turns.append(record)
        return record

    def _act(self, ep: _Episode, record: TurnRecord, tools: Tools, *, last_turn: bool) -> bool:
        """Parse and run the call, append the observation; True when the episode ends."""
        call = record.call = parse_tool_call(self.template.decode(record.completion.token_ids))
        if isinstance(call, ToolCall) and call.name == "submit":
            return self._submit(ep, record, tools)
        out = None
        if isinstance(call, ToolCall):
            t0 = time.perf_counter()
            try:
                out = tools.execute(call)
            except SandboxError as exc:
                ep.stop("sandbox_error", Status.SANDBOX_ERROR, str(exc))
                return True
            finally:
                record.tool_s = time.perf_counter() - t0
        obs_ids, record.observation_truncated = self.observation_ids(call, out)
        record.observation = "".join(format_observation(call, out))
        if last_turn:
            ep.stop("max_turns", Status.TRUNCATED)
            return True
        if len(ep.ids) + len(obs_ids) + 2 > self.limits.budget:  # room for >= 1 new token + <|im_end|>
            ep.stop(self.limits.budget_reason, Status.TRUNCATED)
            return True
        ep.add_context(obs_ids)
        record.observation_tokens = len(obs_ids)
        return False

    @staticmethod
    def _submit(ep: _Episode, record: TurnRecord, tools: Tools) -> bool:
        t0 = time.perf_counter()
        try:
            out = tools.submit()
        except SandboxError as exc:
            ep.stop("sandbox_error", Status.SANDBOX_ERROR, str(exc))
            return True
        finally:
            record.tool_s = time.perf_counter() - t0
        # A failed diff (e.g. no git repo) is the agent's outcome, not an infrastructure fault: EVAL scores it.
        record.observation = "submitted" if out.ok else f"submit failed: {out.text[-500:]}"
        ep.result.submitted = True
        ep.stop("submit", Status.OK)
        return True
