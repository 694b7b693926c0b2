"""Tool-call parsing: well-formed calls, and every malformed shape becomes a ParseError (never raises)."""

from __future__ import annotations

from typing import Any

import pytest

from rollout_node.agent import ParseError, ToolCall, format_tool_call, parse_tool_call
from rollout_node.agent.seeds import EpisodeSeed, sampling_seed


def test_roundtrip_of_every_tool() -> None:
    calls: dict[str, dict[str, Any]] = {"bash": {"command": "ls"}, "python": {"code": "print(1)", "timeout_s": 3},
             "view": {"path": "a.py", "start_line": 2}, "create": {"path": "b.py", "content": "x = 1\n"},
             "str_replace": {"path": "a.py", "old": "x", "new": "y"}, "insert": {"path": "a.py", "line": 0, "text": "#"},
             "submit": {}}
    for name, args in calls.items():
        parsed = parse_tool_call("I will act.\n" + format_tool_call(name, args) + "\n")
        assert isinstance(parsed, ToolCall), parsed
        assert (parsed.name, dict(parsed.arguments)) == (name, args)


@pytest.mark.parametrize(("text", "kind"), [
    ("just prose, no call", "no_call"),
    ('<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}', "unclosed"),
    ("<tool_call>\n{name: bash}\n</tool_call>", "bad_json"),
    ('<tool_call>["bash"]</tool_call>', "bad_json"),
    ('<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', "unknown_tool"),
    ('<tool_call>{"name": "bash", "arguments": {}}</tool_call>', "bad_arguments"),
    ('<tool_call>{"name": "bash", "arguments": {"command": 3}}</tool_call>', "bad_arguments"),
    ('<tool_call>{"name": "bash", "arguments": {"command": "ls", "sudo": true}}</tool_call>', "bad_arguments"),
    ('<tool_call>{"name": "insert", "arguments": {"path": "a", "line": true, "text": "x"}}</tool_call>',
     "bad_arguments"),
    ('<tool_call>{"name": "bash", "arguments": "ls"}</tool_call>', "bad_arguments"),
])
def test_malformed_calls(text: str, kind: str) -> None:
    parsed = parse_tool_call(text)
    assert isinstance(parsed, ParseError)
    assert parsed.kind == kind
    assert parsed.message


def test_only_first_call_runs_and_says_so() -> None:
    text = format_tool_call("bash", {"command": "a"}) + format_tool_call("bash", {"command": "b"})
    parsed = parse_tool_call(text)
    assert isinstance(parsed, ToolCall) and parsed.arguments["command"] == "a"
    assert "1 ignored" in parsed.note


def test_seeds_are_deterministic_and_depend_on_every_input() -> None:
    base = (1, "task-a", 0, 0, 0)
    s = sampling_seed(*base)
    assert s == sampling_seed(*base) == EpisodeSeed(1, "task-a").for_turn(0)
    assert s == 723795044  # pinned: the same on every machine and Python (no salted hash())
    variants = [(2, "task-a", 0, 0, 0), (1, "task-b", 0, 0, 0), (1, "task-a", 1, 0, 0), (1, "task-a", 0, 1, 0),
                (1, "task-a", 0, 0, 1)]
    seeds = {sampling_seed(*v) for v in variants}
    assert len(seeds) == len(variants) and s not in seeds
    assert all(0 <= x < 2 ** 31 for x in seeds)


def test_agent_package_imports_no_torch_or_transformers() -> None:
    import subprocess
    import sys

    code = ("import sys, rollout_node.agent, rollout_node.agent.client, rollout_node.agent.endpoints; "
            "bad = sorted(m for m in ('torch', 'transformers', 'train_node') if m in sys.modules); "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)
