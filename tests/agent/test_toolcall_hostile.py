"""Hostile tool-call JSON (issue 13): parse_tool_call returns a ParseError, it never raises."""

from __future__ import annotations

import pytest

from rollout_node.agent.toolcall import ParseError, ToolCall, parse_tool_call


def call(body: str) -> ToolCall | ParseError:
    return parse_tool_call(f"<tool_call>\n{body}\n</tool_call>")


@pytest.mark.parametrize("body", [
    '{"name": "bash", "arguments": {"command": "ls", "timeout_s": NaN}}',
    '{"name": "bash", "arguments": {"command": "ls", "timeout_s": Infinity}}',
    '{"name": "bash", "arguments": {"command": "ls", "timeout_s": -Infinity}}',
    '{"name": "bash", "arguments": {"command": "ls", "timeout_s": 1e999}}',
    '{"name": "bash", "arguments": {"command": "ls", "timeout_s": -5}}',
    '{"name": "bash", "arguments": {"command": "ls", "timeout_s": 0}}',
    '{"name": "python", "arguments": {"code": "1", "timeout_s": ' + "9" * 5000 + "}}",
    '{"name": "view", "arguments": {"path": "a", "start_line": ' + "9" * 5000 + "}}",
    '{"name": "insert", "arguments": {"path": "a", "line": -7, "text": "x"}}',
    '{"name": "view", "arguments": {"path": "a", "end_line": 10000000000}}',
    '{"name": "bash", "arguments": {"command": "ls"}, "x": ' + "[" * 100000 + "]" * 100000 + "}",
    "[" * 5000,
    '{"name": "bash", "arguments": ' + '{"a": ' * 3000 + "1" + "}" * 3000 + "}",
])
def test_hostile_json_is_a_parse_error(body: str) -> None:
    result = call(body)
    assert isinstance(result, ParseError), result
    assert result.kind in ("bad_json", "bad_arguments") and result.message


def test_brackets_inside_strings_do_not_count_as_nesting() -> None:
    result = call('{"name": "bash", "arguments": {"command": "echo ' + "[[[{{{" * 50 + '\\" ]"}}')
    assert isinstance(result, ToolCall) and result.arguments["command"].startswith("echo [[[")


def test_ordinary_numbers_still_work() -> None:
    ok = call('{"name": "bash", "arguments": {"command": "ls", "timeout_s": 2.5}}')
    assert isinstance(ok, ToolCall) and ok.arguments["timeout_s"] == 2.5
    view = call('{"name": "view", "arguments": {"path": "a", "start_line": 1, "end_line": -1}}')
    assert isinstance(view, ToolCall) and view.arguments["end_line"] == -1
