"""The tool-call format the agent speaks, and its parser.

Format (Hermes / Qwen style, which instruction-tuned ChatML models already emit)::

    <tool_call>
    {"name": "bash", "arguments": {"command": "ls -la"}}
    </tool_call>

Guarantees:
- Parsing reads the decoded text of a completion and never touches its token IDs: the IDs stay as
  generated whatever the parse says.
- One call per turn: the first ``<tool_call>`` block counts; later blocks are ignored and the
  observation says so.
- :func:`parse_tool_call` never raises: no call, an unclosed block, bad JSON (also ``NaN``/
  ``Infinity``, numbers of more than 30 digits, nesting deeper than 64 levels), an unknown tool or
  wrong arguments (also numbers out of range: timeouts must be finite and in (0, 1e6], line numbers
  in [-1, 1e9]) all come back as a :class:`ParseError` whose message becomes the observation.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

OPEN = "<tool_call>"
CLOSE = "</tool_call>"

# tool name -> {argument: (type, required)}; ints are also accepted where numbers are.
TOOL_SPECS: dict[str, dict[str, tuple[type, bool]]] = {
    "bash": {"command": (str, True), "timeout_s": (float, False)},
    "python": {"code": (str, True), "timeout_s": (float, False)},
    "view": {"path": (str, True), "start_line": (int, False), "end_line": (int, False)},
    "create": {"path": (str, True), "content": (str, True)},
    "str_replace": {"path": (str, True), "old": (str, True), "new": (str, True)},
    "insert": {"path": (str, True), "line": (int, True), "text": (str, True)},
    "submit": {},
}

TOOL_DOCS = """\
You can call exactly one tool per turn. Write the call as JSON inside tags:
<tool_call>
{"name": "TOOL", "arguments": {...}}
</tool_call>
Tools:
- bash {"command": str}: run a command in a persistent bash shell (cwd and env persist).
- python {"code": str}: run code in a persistent Python interpreter.
- view {"path": str, "start_line"?: int, "end_line"?: int}: show a file with line numbers, or list a directory.
- create {"path": str, "content": str}: create or overwrite a file.
- str_replace {"path": str, "old": str, "new": str}: replace the one occurrence of old with new.
- insert {"path": str, "line": int, "text": str}: insert text after line (0 = at the top).
- submit {}: finish; your changes to the repository are evaluated."""


MAX_DEPTH = 64
MAX_DIGITS = 30
MAX_TIMEOUT_S = 1e6
MAX_LINE = 10**9


class _Refused(ValueError):
    pass


@dataclass(frozen=True)
class ToolCall:
    """A well-formed call: a known tool with type-checked arguments."""

    name: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    note: str = ""  # e.g. "2 extra tool calls ignored"


@dataclass(frozen=True)
class ParseError:
    """Why a completion holds no usable call; ``message`` is shown to the model."""

    message: str
    kind: str  # "no_call" | "unclosed" | "bad_json" | "unknown_tool" | "bad_arguments"


def format_tool_call(name: str, arguments: Mapping[str, Any] | str) -> str:
    """The canonical text of a call (for scripted policies, prompts, tests and the gateway's rendering)."""
    args = arguments if isinstance(arguments, str) else dict(arguments)
    return f"{OPEN}\n{json.dumps({'name': name, 'arguments': args})}\n{CLOSE}"


def _check_arguments(name: str, args: Mapping[str, Any]) -> str | None:
    spec = TOOL_SPECS[name]
    unknown = sorted(set(args) - set(spec))
    if unknown:
        return f"tool {name!r} has no argument(s) {unknown}; valid: {sorted(spec)}"
    for arg, (typ, required) in spec.items():
        if arg not in args:
            if required:
                return f"tool {name!r} needs argument {arg!r}"
            continue
        value = args[arg]
        ok = isinstance(value, typ) and not isinstance(value, bool)
        if typ is float:
            ok = isinstance(value, int | float) and not isinstance(value, bool)
        if not ok:
            return f"tool {name!r}: argument {arg!r} must be {typ.__name__}, got {type(value).__name__}"
        if typ is float and not (math.isfinite(value) and 0 < value <= MAX_TIMEOUT_S):
            return f"tool {name!r}: argument {arg!r} must be a number of seconds in (0, {MAX_TIMEOUT_S:g}]"
        if typ is int and not -1 <= value <= MAX_LINE:
            return f"tool {name!r}: argument {arg!r} must be a line number in [-1, {MAX_LINE}]"
    return None


def _refuse_constant(name: str) -> Any:
    raise _Refused(f"{name} is not a JSON number")


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_DIGITS:
        raise _Refused(f"a number of {len(text)} digits")
    return int(text)


def _depth(body: str) -> int:
    """The deepest nesting of ``[``/``{`` outside strings (cheap; bounds json's recursion)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in body:
        if in_string:
            escaped, in_string = (not escaped and ch == "\\"), in_string and (escaped or ch != '"')
            continue
        if ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def decode_call_json(body: str) -> tuple[str, Any] | ParseError:
    """``(name, arguments)`` of one block's JSON, any tool name (the gateway serves a harness's own tools).

    The same guards as the agent's parser (depth, digits, no NaN/Infinity); ``arguments`` is what the
    object holds (``{}`` when absent), unchecked."""
    if _depth(body) > MAX_DEPTH:
        return ParseError(f"tool call is nested deeper than {MAX_DEPTH} levels", "bad_json")
    try:
        obj = json.loads(body, parse_constant=_refuse_constant, parse_int=_bounded_int)
    except json.JSONDecodeError as exc:
        return ParseError(f"tool call is not valid JSON ({exc.msg} at char {exc.pos})", "bad_json")
    except (ValueError, RecursionError, MemoryError) as exc:  # _Refused, float overflow, deep nesting
        return ParseError(f"tool call is not acceptable JSON ({str(exc)[:200]})", "bad_json")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ParseError('tool call must be a JSON object {"name": ..., "arguments": {...}}', "bad_json")
    return obj["name"], obj.get("arguments", {})


def _decode_call(body: str) -> ToolCall | ParseError:
    decoded = decode_call_json(body)
    if isinstance(decoded, ParseError):
        return decoded
    name, args = decoded
    if name not in TOOL_SPECS:
        return ParseError(f"unknown tool {name[:100]!r}; tools: {', '.join(TOOL_SPECS)}", "unknown_tool")
    if not isinstance(args, dict):
        return ParseError(f"tool {name!r}: 'arguments' must be a JSON object", "bad_arguments")
    problem = _check_arguments(name, args)
    if problem:
        return ParseError(problem, "bad_arguments")
    return ToolCall(name, args)


def parse_tool_call(text: str) -> ToolCall | ParseError:
    """The first tool call in ``text``, or why there is none."""
    start = text.find(OPEN)
    if start < 0:
        return ParseError(f"no tool call found; call a tool with {OPEN}...{CLOSE} (submit when done)", "no_call")
    end = text.find(CLOSE, start)
    if end < 0:
        return ParseError(f"tool call not closed with {CLOSE}", "unclosed")
    result = _decode_call(text[start + len(OPEN):end].strip())
    extra = text.count(OPEN, end)
    if isinstance(result, ToolCall) and extra:
        return ToolCall(result.name, result.arguments, note=f"only the first tool call runs; {extra} ignored")
    return result
