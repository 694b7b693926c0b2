"""The agent's tools on top of a sandbox: bash, python, file view/create/str_replace/insert, submit.

Guarantees:
- A tool call returns a :class:`ToolOutput`, it does not raise for anything the agent did (bad path,
  no match, timeout, huge output): those are observations. A :class:`hpc.errors.SandboxError`
  from the sandbox (infrastructure) propagates; the loop turns it into a ``sandbox_error`` status.
- Every tool is the sandbox's own (``rollout_node.sandbox.Sandbox``): bash and python run inside
  it; the file tools are its symlink-safe host-side implementations on the work dir (paths are
  sandbox paths: relative to ``/work`` or absolute under it); ``submit`` captures the diff
  (``sandbox.submission``) at the moment the agent submits. This module only maps the call's JSON
  arguments onto those methods, so there is one implementation of each tool.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from rollout_node.agent.toolcall import ToolCall


class SandboxLike(Protocol):
    """The part of ``rollout_node.sandbox.Sandbox`` the tools use (its ToolResult is duck-typed)."""

    def run(self, command: str, *, timeout_s: float | None = None) -> Any: ...
    def python(self, code: str, *, timeout_s: float | None = None) -> Any: ...
    def view(self, path: str, view_range: tuple[int, int] | None = None) -> Any: ...
    def create(self, path: str, text: str, *, overwrite: bool = False) -> Any: ...
    def str_replace(self, path: str, old: str, new: str) -> Any: ...
    def insert(self, path: str, line: int, text: str) -> Any: ...
    def submit(self) -> Any: ...


@dataclass(frozen=True)
class ToolOutput:
    """What a tool produced, before token truncation."""

    text: str
    exit_code: int | None = 0
    timed_out: bool = False
    truncated: bool = False
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class Tools(Protocol):
    """The loop's tool boundary (a sandbox adapter, or a stand-in in benchmarks)."""

    def execute(self, call: ToolCall) -> ToolOutput: ...
    def submit(self) -> ToolOutput: ...


def _from_result(result: Any) -> ToolOutput:
    return ToolOutput(text=str(result.output), exit_code=result.exit_code, timed_out=bool(result.timed_out),
                      truncated=bool(result.truncated), duration_s=float(result.duration_s))


class SandboxTools:
    """:class:`Tools` over a sandbox (``rollout_node.sandbox.open_sandbox`` or anything shaped like it)."""

    def __init__(self, sandbox: SandboxLike, *, timeout_s: float | Callable[[], float] = 60.0) -> None:
        """``timeout_s``: the cap of one bash/python call, or a function giving it at call time (e.g. never
        past the episode's deadline); the agent may ask for less with a ``timeout_s`` argument."""
        self.sandbox = sandbox
        self.timeout_s = timeout_s

    def _timeout(self, call: ToolCall) -> float:
        cap = self.timeout_s() if callable(self.timeout_s) else self.timeout_s
        asked = call.arguments.get("timeout_s")
        return min(float(asked), cap) if asked else cap

    def execute(self, call: ToolCall) -> ToolOutput:
        sb, a = self.sandbox, call.arguments
        if call.name == "bash":
            return _from_result(sb.run(a["command"], timeout_s=self._timeout(call)))
        if call.name == "python":
            return _from_result(sb.python(a["code"], timeout_s=self._timeout(call)))
        if call.name == "view":
            has_range = "start_line" in a or "end_line" in a
            view_range = (a.get("start_line", 1), a.get("end_line", -1)) if has_range else None
            return _from_result(sb.view(a["path"], view_range))
        if call.name == "create":
            return _from_result(sb.create(a["path"], a["content"], overwrite=True))
        if call.name == "str_replace":
            return _from_result(sb.str_replace(a["path"], a["old"], a["new"]))
        if call.name == "insert":
            return _from_result(sb.insert(a["path"], a["line"], a["text"]))
        raise AssertionError(f"tool {call.name!r} is not executable here (the loop handles submit)")

    def submit(self) -> ToolOutput:
        return _from_result(self.sandbox.submit())
