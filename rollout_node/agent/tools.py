"""The agent's tools on top of a sandbox: bash, python, file view/create/str_replace/insert.

Guarantees:
- A tool call returns a :class:`ToolOutput`, it does not raise for anything the agent did (bad path,
  no match, timeout, huge output): those are observations. A :class:`hpc.errors.SandboxError`
  from the sandbox (infrastructure) propagates; the loop turns it into a ``sandbox_error`` status.
- File tools run INSIDE the sandbox (one fresh ``python3`` per call via ``sandbox.exec``), so paths
  and symlinks resolve in the sandbox's view of the filesystem and cannot reach the host.
  Relative paths are relative to ``repo_root`` (default ``/work``, the bind-mounted work dir).
- ``submit`` is not executed here: the loop ends the episode on it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Protocol

from rollout_node.agent.toolcall import ToolCall


class SandboxLike(Protocol):
    """The part of ``rollout_node.sandbox.Sandbox`` the tools use (its ToolResult is duck-typed)."""

    def run(self, command: str, *, timeout_s: float | None = None) -> Any: ...
    def python(self, code: str, *, timeout_s: float | None = None) -> Any: ...
    def exec(self, argv: list[str], *, timeout_s: float | None = None) -> Any: ...


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


# Runs inside the sandbox with the image's python3; stdlib only; argv[1] is a JSON request.
EDITOR_SRC = r'''
import json, os, sys
req = json.loads(sys.argv[1]); op = req["op"]
path = os.path.normpath(os.path.join(req["root"], req["path"]))
def fail(msg):
    print(msg); sys.exit(1)
def read():
    if not os.path.isfile(path): fail(f"no such file: {path}")
    with open(path, encoding="utf-8", errors="replace") as f: return f.read()
def write(text):
    d = os.path.dirname(path)
    if d: os.makedirs(d, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f: f.write(text)
if op == "view":
    if os.path.isdir(path):
        names = sorted(os.listdir(path))
        print("\n".join(n + ("/" if os.path.isdir(os.path.join(path, n)) else "") for n in names)); sys.exit(0)
    lines = read().splitlines()
    a = max(1, req.get("start_line") or 1); b = min(len(lines), req.get("end_line") or len(lines))
    print("\n".join(f"{i:6d}\t{lines[i - 1]}" for i in range(a, b + 1)) if lines else "(empty file)")
elif op == "create":
    write(req["content"]); print(f"wrote {path} ({len(req['content'].splitlines())} lines)")
elif op == "str_replace":
    text = read(); n = text.count(req["old"])
    if not req["old"]: fail("old must not be empty")
    if n != 1: fail(f"old occurs {n} times in {path}; it must occur exactly once")
    write(text.replace(req["old"], req["new"], 1)); print(f"replaced 1 occurrence in {path}")
elif op == "insert":
    lines = read().splitlines(keepends=True); k = req["line"]
    if not 0 <= k <= len(lines): fail(f"line must be in 0..{len(lines)}")
    if lines and not lines[-1].endswith("\n"): lines[-1] += "\n"
    new = req["text"] if req["text"].endswith("\n") else req["text"] + "\n"
    write("".join(lines[:k]) + new + "".join(lines[k:])); print(f"inserted after line {k} of {path}")
else:
    fail(f"unknown op {op}")
'''

FILE_OPS = ("view", "create", "str_replace", "insert")
MAX_ARG_BYTES = 120_000  # Linux caps one argv string at 128 KiB (MAX_ARG_STRLEN)


def _from_result(result: Any) -> ToolOutput:
    return ToolOutput(text=str(result.output), exit_code=result.exit_code, timed_out=bool(result.timed_out),
                      truncated=bool(result.truncated), duration_s=float(result.duration_s))


class SandboxTools:
    """:class:`Tools` over a sandbox (``rollout_node.sandbox.open_sandbox`` or anything shaped like it)."""

    def __init__(self, sandbox: SandboxLike, *, repo_root: str = "/work", timeout_s: float = 60.0,
                 python_exe: str = "python3") -> None:
        self.sandbox = sandbox
        self.repo_root = repo_root
        self.timeout_s = timeout_s
        self.python_exe = python_exe

    def _timeout(self, call: ToolCall) -> float:
        asked = call.arguments.get("timeout_s")
        return min(float(asked), self.timeout_s) if asked else self.timeout_s

    def execute(self, call: ToolCall) -> ToolOutput:
        if call.name == "bash":
            return _from_result(self.sandbox.run(call.arguments["command"], timeout_s=self._timeout(call)))
        if call.name == "python":
            return _from_result(self.sandbox.python(call.arguments["code"], timeout_s=self._timeout(call)))
        if call.name in FILE_OPS:
            request = json.dumps({"op": call.name, "root": self.repo_root, **call.arguments})
            if len(request.encode()) > MAX_ARG_BYTES:
                return ToolOutput(f"arguments too large ({len(request)} chars); write big files in parts", 1)
            argv = [self.python_exe, "-c", EDITOR_SRC, request]
            return _from_result(self.sandbox.exec(argv, timeout_s=self.timeout_s))
        raise AssertionError(f"tool {call.name!r} is not executable here (the loop handles submit)")
