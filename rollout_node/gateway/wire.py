"""The OpenAI chat-completions wire format: request checks, response bodies and SSE chunks.

Guarantees:
- :func:`parse_request` accepts ``messages``, ``tools`` (``type: function`` only), ``tool_choice``,
  ``temperature``, ``top_p``, ``max_tokens`` / ``max_completion_tokens``, ``stop`` (a string or up
  to 4 strings), ``n`` (1 only), ``stream`` and ``stream_options.include_usage``; ``model`` is
  echoed in the answer; ``seed``, ``user``, ``metadata``, ``parallel_tool_calls``, ``logprobs`` /
  ``top_logprobs`` and other fields are accepted and ignored (the episode's seed schedule decides the
  seed: samples of a group must differ; no logprobs are returned).
- Sampling the trainer cannot reproduce is a :class:`WireError` (HTTP 400) naming the field, by the
  rule ``validate`` applies (:func:`hpc.trajectory.sampling_refusal`): temperature 0, ``top_p`` < 1,
  a ``top_k`` cut; also a temperature other than the run's (the trainer scores a trajectory at one
  temperature), ``n`` > 1, non-zero ``frequency_penalty`` / ``presence_penalty`` /
  ``repetition_penalty`` != 1, a ``logit_bias``, ``min_p`` > 0, and a ``response_format`` other than
  text (constrained decoding).
- ``tool_choice`` ``none`` returns tool-call text as content; ``auto``, ``required`` and a named
  function return the policy's output as sampled (nothing constrains decoding, which the trainer
  could not reproduce either).
- Errors use OpenAI's body: ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hpc.trajectory import sampling_refusal
from rollout_node.gateway.render import ToolCallOut

MAX_STOP = 4


class WireError(ValueError):
    """A request the gateway refuses: HTTP ``status`` with an OpenAI error body."""

    def __init__(self, message: str, *, param: str | None = None, status: int = 400,
                 code: str | None = None, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.param, self.status, self.code, self.kind = param, status, code, kind

    def body(self) -> dict[str, Any]:
        return error_body(str(self), kind=self.kind, param=self.param, code=self.code)


def error_body(message: str, *, kind: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@dataclass(frozen=True)
class ChatRequest:
    """A checked ``/v1/chat/completions`` body."""

    messages: tuple[Mapping[str, Any], ...]
    tools: tuple[Mapping[str, Any], ...] = ()
    tool_choice: str = "auto"        # "auto" | "none" | "required" | "function"
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()
    stream: bool = False
    include_usage: bool = False
    model: str = ""


def _number(body: Mapping[str, Any], key: str) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise WireError(f"{key} must be a number", param=key)
    return float(value)


def check_sampling(body: Mapping[str, Any], temperature: float) -> None:
    """Refuse (:class:`WireError`) sampling the trainer cannot reproduce, by ``validate``'s rule."""
    t, p = _number(body, "temperature"), _number(body, "top_p")
    checks = (("temperature", (temperature if t is None else t,)), ("top_p", (1.0, 1.0 if p is None else p)),
              ("top_k", (1.0, 1.0, body.get("top_k"))))
    for param, args in checks:
        if why := sampling_refusal(*args):
            raise WireError(f"{why}. spoolrl trains on these samples, so the gateway refuses sampling the trainer "
                            f"cannot reproduce; drop {param} from the harness's request", param=param)
    if t is not None and abs(t - temperature) > 1e-9:
        raise WireError(f"temperature {t:g} differs from the run's inference.temperature {temperature:g}: the trainer "
                        "scores a trajectory at one temperature; drop temperature from the harness's request or "
                        f"set it to {temperature:g}", param="temperature")
    for key, neutral in (("frequency_penalty", 0.0), ("presence_penalty", 0.0), ("repetition_penalty", 1.0),
                         ("min_p", 0.0)):
        v = _number(body, key)
        if v is not None and v != neutral:
            raise WireError(f"{key} {v:g}: the trainer scores the plain softmax and cannot reproduce it; "
                            f"drop it or use {neutral:g}", param=key)
    if body.get("logit_bias"):
        raise WireError("logit_bias: the trainer scores the plain softmax and cannot reproduce it; drop it",
                        param="logit_bias")
    n = body.get("n", 1)
    if n not in (None, 1):
        raise WireError(f"n {n!r}: one choice per request (each sample is its own episode)", param="n")
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise WireError("response_format: constrained decoding cannot be reproduced by the trainer; use text",
                        param="response_format")


def _tools(body: Mapping[str, Any]) -> tuple[Mapping[str, Any], ...]:
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise WireError("tools must be a list", param="tools")
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not (tool.get("type") == "function" and isinstance(fn, dict) and isinstance(fn.get("name"), str)):
            raise WireError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}",
                            param=f"tools[{i}]")
    return tuple(tools)


def tool_choice(choice: Any) -> str:
    """A request's ``tool_choice`` as the session uses it: auto (also when absent), none, required, or
    ``function`` for a named function (chat's ``{'type': 'function', 'function': {...}}`` and the Responses
    API's ``{'type': 'function', 'name': ...}``: the gateway renders the tools alike either way)."""
    if choice is None:
        return "auto"
    if choice in ("auto", "none", "required"):
        return str(choice)
    if isinstance(choice, dict) and choice.get("type") == "function":
        return "function"
    raise WireError(f"tool_choice {str(choice)[:80]}: use auto, none, required or {{'type': 'function', ...}}",
                    param="tool_choice")


def _max_tokens(body: Mapping[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise WireError(f"{key} must be an integer >= 1", param=key)
        return int(value)
    return None


def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if not (isinstance(stops, list) and len(stops) <= MAX_STOP and all(isinstance(s, str) and s for s in stops)):
        raise WireError(f"stop must be a non-empty string or a list of at most {MAX_STOP}", param="stop")
    return tuple(stops)


def load_body(raw: bytes) -> dict[str, Any]:
    """A request body as a JSON object, or a :class:`WireError`."""
    try:
        body = json.loads(raw)
    except ValueError as exc:
        raise WireError(f"body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise WireError("body must be a JSON object")
    return body


def parse_request(raw: bytes, temperature: float) -> ChatRequest:
    """Check a request body against the session's ``temperature``; a :class:`WireError` says why not."""
    body = load_body(raw)
    messages = body.get("messages")
    if not (isinstance(messages, list) and messages and all(isinstance(m, dict) for m in messages)):
        raise WireError("messages must be a non-empty list of message objects", param="messages")
    check_sampling(body, temperature)
    options = body.get("stream_options") or {}
    return ChatRequest(messages=tuple(messages), tools=_tools(body), tool_choice=tool_choice(body.get("tool_choice")),
                       max_tokens=_max_tokens(body), stop=_stop(body), stream=bool(body.get("stream")),
                       include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
                       model=str(body.get("model") or ""))


@dataclass(frozen=True)
class ChatAnswer:
    """What one call produced, in OpenAI's terms."""

    id: str
    model: str
    content: str | None
    tool_calls: tuple[ToolCallOut, ...]
    finish_reason: str               # "stop" | "length" | "tool_calls"
    prompt_tokens: int
    completion_tokens: int
    created: int = 0

    def usage(self) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens}

    def message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = [c.as_openai() for c in self.tool_calls]
        return msg

    def body(self) -> dict[str, Any]:
        """The non-streaming ``chat.completion`` object."""
        return {"id": self.id, "object": "chat.completion", "created": self.created or int(time.time()),
                "model": self.model, "system_fingerprint": None,
                "choices": [{"index": 0, "message": self.message(), "logprobs": None,
                             "finish_reason": self.finish_reason}],
                "usage": self.usage()}

    def chunks(self, include_usage: bool) -> list[dict[str, Any]]:
        """The ``chat.completion.chunk`` objects of a stream (role, content, tool calls, finish, usage)."""
        created = self.created or int(time.time())

        def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
            out: dict[str, Any] = {"id": self.id, "object": "chat.completion.chunk", "created": created,
                                   "model": self.model, "system_fingerprint": None,
                                   "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}
            if include_usage:
                out["usage"] = None
            return out

        out = [chunk({"role": "assistant", "content": ""})]
        if self.content:
            out.append(chunk({"content": self.content}))
        out += [chunk({"tool_calls": [{"index": i, **c.as_openai()}]}) for i, c in enumerate(self.tool_calls)]
        out.append(chunk({}, self.finish_reason))
        if include_usage:
            out.append({"id": self.id, "object": "chat.completion.chunk", "created": created, "model": self.model,
                        "system_fingerprint": None, "choices": [], "usage": self.usage()})
        return out


def sse(chunks: Sequence[Mapping[str, Any]]) -> bytes:
    """Server-sent events: one ``data:`` line per chunk, then ``data: [DONE]``."""
    lines = [f"data: {json.dumps(c, ensure_ascii=False)}\n\n" for c in chunks]
    return ("".join(lines) + "data: [DONE]\n\n").encode()


def models_body(model: str) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "spoolrl"}]}
