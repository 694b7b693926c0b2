"""The OpenAI Responses wire format (``POST /v1/responses``), mapped onto the chat-completions call.

A Responses request becomes the same :class:`~rollout_node.gateway.wire.ChatRequest` a chat-completions
call makes, so it takes the same session path: the same rendering, prefix merging, segments, budget
and 400/401 rules. Codex CLI (``wire_api = "responses"``) and ``client.responses.create`` talk to it.

Guarantees:
- **Input.** ``instructions`` becomes the first message (role ``system``); ``input`` is a string (one
  user message) or a list of items: ``message`` (role ``user``, ``system``, ``developer`` or
  ``assistant``; content a string or ``input_text`` / ``output_text`` parts), ``function_call``
  (``call_id``, ``name``, ``arguments``) and ``function_call_output`` (``call_id``; ``output`` a string
  or ``input_text`` parts). An assistant message and the function calls right after it are ONE assistant
  turn (as the gateway answered them), so a harness that resends its history unchanged renders the
  exact IDs the policy generated: one segment. Any other item type (``reasoning``, ``item_reference``,
  ``custom_tool_call``, ...) or content part (images, files, refusals) is a 400 naming the field
  (``input[i].type``, ``input[i].content[j]``): never dropped silently.
- **Tools.** ``tools`` holds only ``type: function`` tools in the Responses' flat shape (``name``,
  ``description``, ``parameters``); they are rendered as chat-completions tools, the same prompt. Any
  other tool type (``web_search``, ``custom``, ``local_shell``, ...) is a 400 naming ``tools[i]``.
  ``strict`` and ``parallel_tool_calls`` are accepted and not enforced: nothing constrains decoding
  (the trainer could not reproduce it); the policy's output is returned as sampled. ``tool_choice``:
  ``auto``, ``none``, ``required`` or ``{"type": "function", "name": ...}``, as for chat completions.
- **Sampling** is checked by the chat path's rule (:func:`~rollout_node.gateway.wire.check_sampling`):
  ``temperature`` other than the run's, ``top_p`` < 1 and the rest are a 400; ``max_output_tokens`` caps
  the completion; ``text.format`` other than ``text`` (constrained decoding) is a 400.
- **No server-side state.** The gateway stores nothing: ``store`` must be false or absent (Codex sends
  false; an absent ``store`` is accepted because nothing is kept either way), and ``previous_response_id``,
  ``conversation``, ``prompt``, ``background: true`` and ``truncation: auto`` are a 400: the harness
  sends its whole history each call. ``reasoning``, ``include``, ``text.verbosity``, ``metadata``,
  ``prompt_cache_key``, ``service_tier``, ``user``, ``client_metadata`` and other fields are accepted and
  ignored (the model's chat template decides whether it thinks; no reasoning items are returned).
- **Output.** One ``message`` item (its ``output_text``) when the policy wrote text, then one
  ``function_call`` item per ``<tool_call>`` block (``call_id``, ``name``, ``arguments`` as a JSON
  string). ``status`` is ``completed``, or ``incomplete`` (``incomplete_details.reason:
  max_output_tokens``) when the completion hit its cap. ``usage`` counts the prompt and completion tokens.
- **Stream** (``stream: true``): server-sent events with ``event:`` and ``data:`` lines, numbered by
  ``sequence_number``: ``response.created``, ``response.in_progress``; per message item
  ``response.output_item.added``, ``response.content_part.added``, ``response.output_text.delta`` (the
  whole text, once), ``response.output_text.done``, ``response.content_part.done``,
  ``response.output_item.done``; per function call ``response.output_item.added``,
  ``response.function_call_arguments.delta`` / ``.done``, ``response.output_item.done``; then
  ``response.completed`` (or ``response.incomplete``) with the whole response and its usage. The stream
  is written once the backend answered (the backend call itself is not streamed); no ``[DONE]``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rollout_node.gateway.wire import ChatAnswer, ChatRequest, WireError, check_sampling, load_body, tool_choice

# top-level fields that need server-side state or change what the model sees: refused while set
_STATEFUL = {"previous_response_id": "the gateway stores no responses",
             "conversation": "the gateway stores no conversations",
             "prompt": "the gateway has no stored prompt templates"}


@dataclass(frozen=True)
class ResponsesRequest:
    """A checked ``/v1/responses`` body: ``chat`` is the equivalent chat-completions call, the rest is
    echoed in the response object."""

    chat: ChatRequest
    instructions: str | None = None
    tools: tuple[Mapping[str, Any], ...] = ()
    tool_choice: Any = "auto"
    parallel_tool_calls: bool = True
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None


def _text_of(content: Any, where: str) -> str:
    """A message's content (a string or ``input_text`` / ``output_text`` parts) as text."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise WireError(f"{where}.content must be a string or a list of input_text / output_text parts",
                        param=f"{where}.content")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in ("input_text", "output_text") or not isinstance(part.get("text"), str):
            raise WireError(f"{where}.content[{j}]: type {kind!r} is not supported; the gateway takes text only "
                            "(input_text, output_text)", param=f"{where}.content[{j}]")
        texts.append(part["text"])
    return "".join(texts)


def _string(item: Mapping[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise WireError(f"{where}.{key} must be a string", param=f"{where}.{key}")
    return value


def _call(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A ``function_call`` item as a chat-completions tool call."""
    name, arguments = _string(item, "name", where), _string(item, "arguments", where)
    return {"id": _string(item, "call_id", where), "type": "function",
            "function": {"name": name, "arguments": arguments}}


def _message(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in ("user", "system", "developer", "assistant"):
        raise WireError(f"{where}.role {role!r} is not one of user, system, developer, assistant",
                        param=f"{where}.role")
    return {"role": role, "content": _text_of(item.get("content"), where)}


def _tool_output(item: Mapping[str, Any], where: str) -> dict[str, Any]:
    output = item.get("output")
    text = output if isinstance(output, str) else _text_of(output, f"{where}.output")
    return {"role": "tool", "tool_call_id": _string(item, "call_id", where), "content": text}


def input_messages(instructions: str | None, items: Any) -> list[dict[str, Any]]:
    """``instructions`` + ``input`` as chat messages; an assistant message and the function calls that
    follow it become one assistant message (one turn of the policy)."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": instructions}] if instructions else []
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    if not (isinstance(items, list) and all(isinstance(i, dict) for i in items)):
        raise WireError("input must be a string or a list of items", param="input")
    open_turn = False  # the last message is an assistant turn that function calls may still join
    for i, item in enumerate(items):
        where, kind = f"input[{i}]", item.get("type", "message")
        if kind == "function_call":
            if not open_turn:
                messages.append({"role": "assistant", "content": None})
            messages[-1].setdefault("tool_calls", []).append(_call(item, where))
            open_turn = True
        elif kind == "message":
            messages.append(_message(item, where))
            open_turn = messages[-1]["role"] == "assistant"
        elif kind == "function_call_output":
            messages.append(_tool_output(item, where))
            open_turn = False
        else:
            raise WireError(f"{where}.type {kind!r} is not supported: the gateway takes message, function_call "
                            "and function_call_output items (it returns no other kind)", param=f"{where}.type")
    if not messages:
        raise WireError("input is empty", param="input")
    return messages


def chat_tools(body: Mapping[str, Any]) -> tuple[dict[str, Any], ...]:
    """Flat Responses function tools as chat-completions tools (what the renderer writes into the prompt)."""
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise WireError("tools must be a list", param="tools")
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function" or not isinstance(tool.get("name"), str):
            raise WireError(f"tools[{i}]: type {kind!r} is not supported; the gateway serves function tools only "
                            "({'type': 'function', 'name': ...}): turn the harness's built-in tools of other types "
                            "off", param=f"tools[{i}]")
        out.append({"type": "function", "function": {k: tool[k] for k in ("name", "description", "parameters")
                                                      if tool.get(k) is not None}})
    return tuple(out)


def _check_stateless(body: Mapping[str, Any]) -> None:
    for key, why in _STATEFUL.items():
        if body.get(key) is not None:
            raise WireError(f"{key}: {why}; send the whole history in input", param=key)
    if body.get("store"):
        raise WireError("store true: the gateway stores no responses; send store false (the harness resends "
                        "its history)", param="store")
    if body.get("background"):
        raise WireError("background true: the gateway answers in the request", param="background")
    if body.get("truncation") not in (None, "disabled"):
        raise WireError("truncation: the gateway never drops input items; use disabled", param="truncation")
    text = body.get("text")
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise WireError("text.format: constrained decoding cannot be reproduced by the trainer; use text",
                        param="text.format")


def _max_output_tokens(body: Mapping[str, Any]) -> int | None:
    value = body.get("max_output_tokens")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise WireError("max_output_tokens must be an integer >= 1", param="max_output_tokens")
    return value


def parse_responses(raw: bytes, temperature: float) -> ResponsesRequest:
    """Check a ``/v1/responses`` body against the session's ``temperature``; a :class:`WireError` says why not."""
    body = load_body(raw)
    _check_stateless(body)
    check_sampling(body, temperature)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise WireError("instructions must be a string", param="instructions")
    if "input" not in body:
        raise WireError("input is required", param="input")
    limit = _max_output_tokens(body)
    chat = ChatRequest(messages=tuple(input_messages(instructions, body["input"])), tools=chat_tools(body),
                       tool_choice=tool_choice(body.get("tool_choice")), max_tokens=limit,
                       stream=bool(body.get("stream")), model=str(body.get("model") or ""))
    return ResponsesRequest(chat=chat, instructions=instructions, tools=tuple(body.get("tools") or ()),
                            tool_choice=body.get("tool_choice") or "auto",
                            parallel_tool_calls=body.get("parallel_tool_calls", True) is not False,
                            max_output_tokens=limit, temperature=body.get("temperature"), top_p=body.get("top_p"))


# -- the answer ----------------------------------------------------------------------------------------


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


@dataclass(frozen=True)
class ResponsesAnswer:
    """One answer in the Responses' terms; the ids are made once, so the stream and the final object agree."""

    request: ResponsesRequest
    answer: ChatAnswer
    id: str = field(default_factory=lambda: _new_id("resp"))
    message_id: str = field(default_factory=lambda: _new_id("msg"))
    created_at: int = field(default_factory=lambda: int(time.time()))

    def message_item(self, done: bool = True) -> dict[str, Any] | None:
        """The assistant ``message`` item (``done`` False: as a stream opens it, no content yet), None when
        the policy wrote only tool calls."""
        if not self.answer.content:
            return None
        return {"id": self.message_id, "type": "message", "role": "assistant",
                "status": "completed" if done else "in_progress",
                "content": [_text_part(self.answer.content)] if done else []}

    def call_items(self) -> list[dict[str, Any]]:
        return [{"id": "fc_" + c.id.removeprefix("call_"), "type": "function_call", "status": "completed",
                 "call_id": c.id, "name": c.name, "arguments": c.arguments} for c in self.answer.tool_calls]

    def output(self) -> list[dict[str, Any]]:
        message = self.message_item()
        return ([message] if message else []) + self.call_items()

    @property
    def status(self) -> str:
        return "incomplete" if self.answer.finish_reason == "length" else "completed"

    def usage(self) -> dict[str, Any]:
        a = self.answer
        return {"input_tokens": a.prompt_tokens, "input_tokens_details": {"cached_tokens": 0},
                "output_tokens": a.completion_tokens, "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": a.prompt_tokens + a.completion_tokens}

    def body(self, final: bool = True) -> dict[str, Any]:
        """The ``response`` object: ``final`` False gives the in-progress one a stream opens with."""
        r = self.request
        return {"id": self.id, "object": "response", "created_at": self.created_at,
                "status": self.status if final else "in_progress", "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if final and self.status == "incomplete" else None,
                "instructions": r.instructions, "max_output_tokens": r.max_output_tokens,
                "model": self.answer.model, "output": self.output() if final else [],
                "parallel_tool_calls": r.parallel_tool_calls, "previous_response_id": None,
                "reasoning": {"effort": None, "summary": None}, "store": False, "temperature": r.temperature,
                "text": {"format": {"type": "text"}}, "tool_choice": r.tool_choice, "tools": list(r.tools),
                "top_p": r.top_p, "truncation": "disabled", "usage": self.usage() if final else None,
                "metadata": {}}

    def events(self) -> list[dict[str, Any]]:
        """The stream's events, in order, each with its ``sequence_number``."""
        events: list[dict[str, Any]] = [{"type": "response.created", "response": self.body(final=False)},
                                        {"type": "response.in_progress", "response": self.body(final=False)}]
        index = 0
        if self.answer.content:
            events += self._message_events(index)
            index += 1
        for j, item in enumerate(self.call_items()):
            events += _call_events(index + j, item)
        events.append({"type": f"response.{self.status}", "response": self.body()})
        return [{**e, "sequence_number": n} for n, e in enumerate(events)]

    def _message_events(self, index: int) -> list[dict[str, Any]]:
        text, where = self.answer.content or "", {"item_id": self.message_id, "output_index": index}
        part = {**where, "content_index": 0}
        return [{"type": "response.output_item.added", "output_index": index, "item": self.message_item(done=False)},
                {"type": "response.content_part.added", **part, "part": _text_part("")},
                {"type": "response.output_text.delta", **part, "delta": text, "logprobs": []},
                {"type": "response.output_text.done", **part, "text": text, "logprobs": []},
                {"type": "response.content_part.done", **part, "part": _text_part(text)},
                {"type": "response.output_item.done", "output_index": index, "item": self.message_item()}]


def _text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _call_events(index: int, item: Mapping[str, Any]) -> list[dict[str, Any]]:
    where = {"item_id": item["id"], "output_index": index}
    return [{"type": "response.output_item.added", "output_index": index,
             "item": {**item, "status": "in_progress", "arguments": ""}},
            {"type": "response.function_call_arguments.delta", **where, "delta": item["arguments"]},
            {"type": "response.function_call_arguments.done", **where, "name": item["name"],
             "arguments": item["arguments"]},
            {"type": "response.output_item.done", "output_index": index, "item": dict(item)}]


def event_stream(events: Sequence[Mapping[str, Any]]) -> bytes:
    """Server-sent events as OpenAI writes them for the Responses API: ``event:`` then ``data:``."""
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e, ensure_ascii=False)}\n\n" for e in events).encode()
