"""One episode's gateway session: renders each call, asks the backend, records token-exact segments.

Guarantees:
- Calls of one session run one at a time (a harness's parallel calls queue), each as: render the
  messages (:class:`rollout_node.gateway.render.Renderer`, prefix merging included), pick the
  segment, ask the backend (the episode's :class:`rollout_node.agent.policy.Policy`, e.g. an
  :class:`rollout_node.agent.client.EpisodeSession`) with token IDs, and only when it answered record
  the tokens: a failed call leaves the trace as it was.
- **Segments.** When the new prompt starts with the current segment's tokens (prompt + completions
  so far), the segment grows by the new context tokens (mask 0) and the completion (mask 1);
  otherwise a new segment starts, and the tokens its prompt shares with the previous segment's start
  count as ``reprefill_tokens`` (the trainer processes them again). Each segment is a
  :class:`rollout_node.pipeline.policy.Transcript`: aligned IDs, loss mask, behaviour logprobs and
  per-token policy versions, as the backend reported them. A completion that did not end with the
  end-of-turn token gets it appended with mask 0 (as the built-in agent loop does).
- ``stop`` strings: the completion is cut after the token at which a stop string is complete; the
  tokens kept are a prefix of what was sampled, so their logprobs stay exact; the content returned
  ends before the stop string.
- Budget: a call whose prompt leaves no room in ``max_tokens`` (per segment, one token kept for an
  appended end-of-turn) is refused with OpenAI's ``context_length_exceeded`` (400) and
  ``trace.context_exhausted`` is set: the agent's outcome (truncated), not infrastructure.
- A backend failure (:class:`hpc.errors.InferenceError`, or anything the backend raises) answers 502
  and is recorded as ``trace.error`` (infrastructure); the session stays open.
- A call refused with a 400 (:class:`~rollout_node.gateway.wire.WireError`) leaves the segments as they were
  and its message in ``trace.refused``.
- After :meth:`GatewaySession.close` every call is refused (401), a call in flight included: nothing
  of it is recorded, so the returned :class:`SessionTrace` is final.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollout_node.agent.loop import AgentLimits
from rollout_node.agent.policy import Completion, Policy, SamplingParams
from rollout_node.agent.seeds import EpisodeSeed
from rollout_node.agent.template import ChatTemplate
from rollout_node.gateway.render import AssistantKey, Renderer, RenderError, assistant_key, split_tool_calls
from rollout_node.gateway.wire import ChatAnswer, ChatRequest, WireError
from rollout_node.pipeline.policy import Transcript

_LIMITS = AgentLimits()  # the config's defaults, stated once in hpc/config


@dataclass(frozen=True)
class GatewaySampling:
    """How a session samples: the run's temperature / top_p, the per-call and per-segment token caps,
    and the episode's seed schedule (call ``i`` uses ``seed.for_turn(i)``; None: the server decides)."""

    temperature: float = _LIMITS.temperature
    top_p: float = _LIMITS.top_p
    max_new_tokens: int = _LIMITS.max_new_tokens_per_turn  # a call's max_tokens is capped by it
    max_tokens: int = _LIMITS.budget                         # prompt + completions of one segment
    seed: EpisodeSeed | None = None

    @classmethod
    def from_limits(cls, limits: AgentLimits, seed: EpisodeSeed | None = None) -> GatewaySampling:
        """From the agent's limits (``rollout.*`` / ``inference.*`` and the servers' context length)."""
        return cls(temperature=limits.temperature, top_p=limits.top_p, max_new_tokens=limits.max_new_tokens_per_turn,
                   max_tokens=limits.budget, seed=seed)

    def record(self) -> dict[str, Any]:
        """The trajectory's ``sampling`` record (what the trainer checks before scoring)."""
        return {"temperature": self.temperature, "top_p": self.top_p, "max_new_tokens_per_turn": self.max_new_tokens,
                "seed": None if self.seed is None else vars(self.seed)}


@dataclass
class SessionTrace:
    """What one session recorded (returned by :meth:`GatewaySession.close`)."""

    segments: list[Transcript] = field(default_factory=list)
    calls: int = 0                    # calls answered (completions recorded)
    reprefill_tokens: int = 0         # prompt tokens of later segments that earlier ones already held
    llm_s: float = 0.0                # time waiting for the backend
    gateway_s: float = 0.0            # the gateway's own time per call (render, parse, HTTP), LLM excluded
    error: str | None = None          # the last infrastructure failure (backend/gateway), None if none
    refused: str | None = None        # why the gateway last refused a call (a 400: sampling, messages, budget)
    context_exhausted: bool = False   # a call was refused for lack of room in max_tokens
    logprob_kind: str = "unknown"     # of the recorded logprobs; "unknown" when calls disagreed
    sampling: dict[str, Any] = field(default_factory=dict)

    @property
    def generated_tokens(self) -> int:
        return sum(sum(s.loss_mask) for s in self.segments)

    def min_version(self) -> int | None:
        versions = [v for s in self.segments if (v := s.min_version()) is not None]
        return min(versions) if versions else None


class SessionClosed(Exception):
    """The session ended (the episode is over): its key no longer opens anything."""


@dataclass(frozen=True)
class BackendFailed(Exception):
    """The backend failed this call (infrastructure); the harness gets 502."""

    message: str


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def stop_cut(template: ChatTemplate, ids: Sequence[int], stops: Sequence[str]) -> tuple[int, str] | None:
    """``(tokens to keep, content)`` when a stop string occurs in the decoded completion, else None."""
    text = template.decode(ids)
    hits = [(pos, s) for s in stops if (pos := text.find(s)) >= 0]
    if not hits:
        return None
    pos, stop = min(hits)
    need = pos + len(stop)
    lo, hi = 1, len(ids)  # the first prefix whose text holds the whole stop string
    while lo < hi:
        mid = (lo + hi) // 2
        if len(template.decode(ids[:mid])) >= need:
            hi = mid
        else:
            lo = mid + 1
    return lo, text[:pos]


class GatewaySession:
    """One episode's session: ``key`` is the harness's ``OPENAI_API_KEY``; ``socket_path`` the gateway's
    Unix socket (relayed to ``http://127.0.0.1:PORT/v1`` inside the sandbox)."""

    def __init__(self, *, key: str, episode_key: str, socket_path: Path, model: str, backend: Policy,
                 template: ChatTemplate, sampling: GatewaySampling, on_close: Callable[[str], None]) -> None:
        self.key, self.episode_key, self.socket_path, self.model = key, episode_key, socket_path, model
        self.backend, self.template, self.sampling = backend, template, sampling
        self.renderer = Renderer(template)
        self._on_close = on_close
        self._call_lock = threading.Lock()   # one call at a time
        self._state = threading.Lock()       # the trace and the produced-message map
        self._trace = SessionTrace(sampling=sampling.record())
        self._produced: dict[AssistantKey, list[tuple[int, ...]]] = {}
        self._kinds: set[str] = set()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def llm_s(self) -> float:
        """Seconds this session has waited for the backend so far."""
        with self._state:
            return self._trace.llm_s

    def chat(self, request: ChatRequest) -> ChatAnswer:
        """Answer one call (blocking; the gateway runs it in a worker thread)."""
        with self._call_lock:
            if self._closed:
                raise SessionClosed()
            with self._state:
                current = self._trace.segments[-1].token_ids if self._trace.segments else None
            try:  # the produced map changes only in _record, under the call lock held here
                prompt = self.renderer.prompt(request.messages, request.tools, self._produced)
            except RenderError as exc:
                raise WireError(str(exc), param=exc.param) from exc
            room = self.sampling.max_tokens - len(prompt) - 1
            if room < 1:
                with self._state:
                    if not self._closed:
                        self._trace.context_exhausted = True
                raise WireError(f"the conversation is {len(prompt)} tokens; this session allows "
                                f"{self.sampling.max_tokens} per sequence (rollout.max_tokens)",
                                param="messages", code="context_length_exceeded")
            cap = min(self.sampling.max_new_tokens, room, request.max_tokens or room)
            completion, llm_s = self._generate(prompt, cap)
            return self._record(request, prompt, current, completion, llm_s)

    def _generate(self, prompt: list[int], cap: int) -> tuple[Completion, float]:
        s = self.sampling
        params = SamplingParams(max_tokens=cap, temperature=s.temperature, top_p=s.top_p,
                                seed=None if s.seed is None else s.seed.for_turn(self._trace.calls),
                                stop_token_ids=tuple(self.template.stop_token_ids))
        t0 = time.perf_counter()
        try:
            completion = self.backend.generate(prompt, params)
        except Exception as exc:  # any backend failure is infrastructure, recorded and answered 502
            with self._state:
                if not self._closed:  # the trace close() returned is final
                    self._trace.llm_s += time.perf_counter() - t0
                    self._trace.error = f"backend: {exc}"
            raise BackendFailed(f"the policy's inference backend failed: {exc}") from exc
        return completion, time.perf_counter() - t0

    def _record(self, request: ChatRequest, prompt: list[int], current: list[int] | None,
                completion: Completion, llm_s: float) -> ChatAnswer:
        t = self.template
        ids, logprobs, versions = completion.token_ids, completion.logprobs, completion.versions
        cut = stop_cut(t, ids, request.stop) if request.stop else None
        if cut is not None:
            keep, text = cut
            ids, logprobs, versions = ids[:keep], logprobs[:keep], versions[:keep]
        else:
            text = t.decode(ids)
        ended = bool(ids) and ids[-1] in t.stop_token_ids
        content, calls = split_tool_calls(text) if request.tool_choice != "none" else (text.strip(), [])
        stored = tuple(ids) if ids and ids[-1] == t.im_end else (*ids, t.im_end)
        with self._state:
            if self._closed:
                raise SessionClosed()
            trace = self._trace
            if current is not None and prompt[:len(current)] == current:
                segment = trace.segments[-1]
                segment.add_context(prompt[len(current):])
            else:
                if current is not None:
                    trace.reprefill_tokens += common_prefix(current, prompt)
                segment = Transcript()
                trace.segments.append(segment)
                segment.add_context(prompt)
            segment.add_generated(ids, logprobs, versions)
            if stored[-1:] != ids[-1:]:
                segment.add_context(stored[-1:])
            key = assistant_key(content, [(c.id, c.name, c.arguments) for c in calls])
            self._produced.setdefault(key, []).append(stored)
            trace.calls += 1
            trace.llm_s += llm_s
            self._kinds.add(completion.logprob_kind)
            trace.logprob_kind = completion.logprob_kind if len(self._kinds) == 1 else "unknown"
        finish = "tool_calls" if calls else ("stop" if ended or cut is not None else "length")
        return ChatAnswer(id=f"chatcmpl-{uuid.uuid4().hex}", model=request.model or self.model,
                          content=content if content or not calls else None, tool_calls=tuple(calls),
                          finish_reason=finish, prompt_tokens=len(prompt), completion_tokens=len(ids),
                          created=int(time.time()))

    def add_gateway_time(self, seconds: float) -> None:
        """The gateway's own time for one call (the HTTP handler's time minus the LLM's)."""
        with self._state:
            if not self._closed:
                self._trace.gateway_s += max(0.0, seconds)

    def note_refusal(self, message: str) -> None:
        """A call the gateway refused (400), kept as ``trace.refused``: a harness that never got an answer
        (e.g. it sends a temperature other than the run's) fails with this reason, not a bare exit status."""
        with self._state:
            if not self._closed:
                self._trace.refused = message

    def note_error(self, message: str) -> None:
        """An infrastructure failure inside the gateway itself (recorded as ``trace.error``)."""
        with self._state:
            if not self._closed:
                self._trace.error = f"gateway: {message}"

    def close(self) -> SessionTrace:
        """End the session: its key gets 401 from now on; returns the final trace (idempotent)."""
        with self._state:
            self._closed = True
            trace = self._trace
        self._on_close(self.key)
        return trace
