"""OpenAI chat messages + tools -> prompt token IDs, and generated text -> OpenAI ``tool_calls``.

Guarantees:
- Rendering uses :class:`rollout_node.agent.template.ChatTemplate`'s piece rule (each message's
  content tokenized alone, special-token text in content stays text), so the same messages and
  tools always give the same IDs, and IDs the gateway sent are exactly what it records.
- **Prefix merging.** An assistant message the gateway produced (looked up by its content and tool
  calls' names and arguments, see :func:`assistant_key`; call ids do not matter, so a harness that
  renumbers them still matches; the k-th message with one key is the k-th answer produced with it) is
  rendered as ``prefix("assistant")`` + the exact IDs it generated (end-of-turn included) +
  ``after_end_of_turn``: never decoded and encoded again. A harness that resends its history
  unchanged therefore gets a prompt that extends the previous prompt + completion token for token.
- Tool format (Qwen 2.5's text, used for both supported chat formats): the tools are listed as JSON
  lines inside ``<tools></tools>`` after the system message's content (a system message holding only
  the tools block is added when the conversation has none); a call is
  ``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``; consecutive ``tool`` messages
  become one message of role ``user`` (ChatML) or ``ipython`` (Llama 3) holding one
  ``<tool_response>\\n...\\n</tool_response>`` block each. ``developer`` messages render as ``system``.
- :func:`split_tool_calls` never raises: a block that is not acceptable JSON (the agent parser's
  guards) stays in the content as text.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rollout_node.agent.template import ChatTemplate
from rollout_node.agent.toolcall import CLOSE, OPEN, ParseError, decode_call_json, format_tool_call

TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
)
TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n'
    "</tool_call>"
)
TOOL_RESULT_ROLE = {"chatml": "user", "llama3": "ipython"}

# (content, ((name, canonical arguments), ...)): how a produced assistant message is recognised
AssistantKey = tuple[str, tuple[tuple[str, str], ...]]
# each key -> the IDs of the answers produced with it, in order
Produced = Mapping[AssistantKey, Sequence[Sequence[int]]]


class RenderError(ValueError):
    """The messages cannot be rendered (a 400 for the harness); ``param`` names the offending field."""

    def __init__(self, message: str, param: str = "messages") -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class ToolCallOut:
    """One call the model made, in OpenAI's terms (``arguments`` is a JSON string)."""

    id: str
    name: str
    arguments: str

    def as_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def content_text(content: Any, where: str) -> str:
    """A message's ``content`` as text: a string, None (empty) or a list of ``{"type": "text"}`` parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise RenderError(f"{where}: only text content parts are supported (got {str(part)[:80]})")
            texts.append(part["text"])
        return "".join(texts)
    raise RenderError(f"{where}: content must be a string, null or a list of text parts")


def canonical_arguments(arguments: Any) -> str:
    """Arguments as one canonical JSON text (a harness may re-serialise the string it got)."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return arguments
    return json.dumps(arguments, sort_keys=True, separators=(",", ":"))


def _calls_of(message: Mapping[str, Any], where: str) -> list[tuple[str, str, Any]]:
    """``(id, name, arguments)`` of an assistant message's ``tool_calls``."""
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise RenderError(f"{where}.tool_calls must be a list")
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not (isinstance(fn, dict) and isinstance(fn.get("name"), str)):
            raise RenderError(f"{where}.tool_calls[{j}] needs function.name")
        out.append((str(call.get("id", "")), fn["name"], fn.get("arguments", "{}")))
    return out


def assistant_key(content: str, calls: Sequence[tuple[str, str, Any]]) -> AssistantKey:
    """The lookup key of an assistant message: stripped content + (name, canonical arguments) per
    ``(id, name, arguments)`` call."""
    return content.strip(), tuple((name, canonical_arguments(args)) for _cid, name, args in calls)


def _arguments_value(arguments: Any) -> Any:
    """Arguments as the object the model writes inside ``<tool_call>`` (a JSON string is parsed)."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


class Renderer:
    """Messages + tools -> IDs with one :class:`ChatTemplate`; one per session (not thread-safe).

    Content encodings are memoised (up to ``MAX_CACHED`` texts), so a harness that resends its history
    pays the tokenizer only for the messages that are new since its last call."""

    MAX_CACHED = 4096

    def __init__(self, template: ChatTemplate) -> None:
        self.template = template
        self.tool_role = TOOL_RESULT_ROLE[template.format.name]
        self._encoded: dict[str, tuple[int, ...]] = {}

    def _encode(self, text: str) -> tuple[int, ...]:
        ids = self._encoded.get(text)
        if ids is None:
            if len(self._encoded) >= self.MAX_CACHED:
                self._encoded.clear()
            ids = self._encoded[text] = tuple(self.template.encode_content(text))
        return ids

    def _message(self, role: str, text: str) -> list[int]:
        return self.template.message_ids(role, self._encode(text))

    def tools_block(self, tools: Sequence[Mapping[str, Any]]) -> str:
        return TOOLS_HEADER + "\n".join(json.dumps(t, ensure_ascii=False) for t in tools) + TOOLS_FOOTER

    def prompt(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]],
               produced: Produced) -> list[int]:
        """The prompt IDs: BOS (if the template has one), every message, then the generation prompt."""
        t = self.template
        ids: list[int] = list(t.bos_prefix)
        pending_tools: list[str] = []
        seen: dict[AssistantKey, int] = {}
        first = messages[0] if messages else {}
        if tools and first.get("role") not in ("system", "developer"):
            ids += self._message("system", self.tools_block(tools))
        for i, m in enumerate(messages):
            where = f"messages[{i}]"
            role = m.get("role")
            if role != "tool" and pending_tools:
                ids += self._tool_results(pending_tools)
                pending_tools = []
            text = content_text(m.get("content"), where)
            if role in ("system", "developer"):
                if tools and i == 0:
                    text = f"{text}\n\n{self.tools_block(tools)}" if text else self.tools_block(tools)
                ids += self._message("system", text)
            elif role == "user":
                ids += self._message("user", text)
            elif role == "assistant":
                ids += self._assistant(text, _calls_of(m, where), produced, seen)
            elif role == "tool":
                pending_tools.append(text)
            else:
                raise RenderError(f"{where}.role {role!r} is not one of system, developer, user, assistant, tool")
        if pending_tools:
            ids += self._tool_results(pending_tools)
        return ids + list(t.generation_prompt)

    def _assistant(self, text: str, calls: list[tuple[str, str, Any]],
                   produced: Produced, seen: dict[AssistantKey, int]) -> list[int]:
        t = self.template
        key = assistant_key(text, calls)
        k = seen[key] = seen.get(key, -1) + 1
        answers = produced.get(key, ())
        if k < len(answers):
            return [*t.prefix("assistant"), *answers[k], *t.after_end_of_turn]
        blocks = [format_tool_call(name, _arguments_value(args)) for _cid, name, args in calls]
        body = "\n".join(([text] if text else []) + blocks)
        return self._message("assistant", body)

    def _tool_results(self, results: Sequence[str]) -> list[int]:
        body = "\n".join(f"<tool_response>\n{r}\n</tool_response>" for r in results)
        return self._message(self.tool_role, body)


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def split_tool_calls(text: str) -> tuple[str, list[ToolCallOut]]:
    """``(content, calls)``: every well-formed ``<tool_call>`` block becomes a call and leaves the
    content; the rest of the text (stripped) is the content."""
    calls: list[ToolCallOut] = []
    kept: list[str] = []
    pos = 0
    while (start := text.find(OPEN, pos)) >= 0:
        end = text.find(CLOSE, start)
        if end < 0:
            break
        decoded = decode_call_json(text[start + len(OPEN):end].strip())
        if isinstance(decoded, ParseError):
            kept.append(text[pos:end + len(CLOSE)])
        else:
            name, args = decoded
            kept.append(text[pos:start])
            arguments = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
            calls.append(ToolCallOut(new_call_id(), name, arguments))
        pos = end + len(CLOSE)
    kept.append(text[pos:])
    return "".join(kept).strip(), calls
