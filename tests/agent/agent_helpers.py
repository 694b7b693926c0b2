"""Test doubles for the agent tests: a scripted ID policy, recording tools, a local sandbox stand-in."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollout_node.agent import ChatTemplate, Completion, SamplingParams, ToolCall, ToolOutput


def build_tiny(path: Path, seed: int = 0) -> Path:
    try:
        from train_node.infer.tiny_model import build_tiny_model
    except ImportError:  # the module's planned name
        from train_node.infer.tiny import build_tiny_model  # type: ignore[no-redef]
    return Path(build_tiny_model(path, seed=seed))


@dataclass
class ScriptedIds:
    """A policy that answers turn k with ``texts[k]`` encoded canonically (+ <|im_end|> unless ``open_ended``)."""

    template: ChatTemplate
    texts: Sequence[str]
    open_ended: Sequence[bool] = ()
    version: int = 7
    prompts: list[list[int]] = field(default_factory=list)
    samplings: list[SamplingParams] = field(default_factory=list)

    def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Completion:
        k = len(self.prompts)
        self.prompts.append(list(prompt_ids))
        self.samplings.append(sampling)
        ids = self.template.encode(self.texts[k % len(self.texts)])
        open_ended = self.open_ended[k] if k < len(self.open_ended) else False
        if not open_ended:
            ids.append(self.template.im_end)
        ids = ids[: sampling.max_tokens]
        return Completion(tuple(ids), tuple(-0.5 for _ in ids), tuple(self.version for _ in ids),
                          finish_reason="length" if open_ended else "stop", server="scripted")


@dataclass
class RecordingTools:
    """Tools that record each call and answer with ``output`` (or raise ``error``)."""

    output: str = "ok"
    exit_code: int = 0
    error: Exception | None = None
    calls: list[ToolCall] = field(default_factory=list)

    def execute(self, call: ToolCall) -> ToolOutput:
        self.calls.append(call)
        if self.error is not None:
            raise self.error
        return ToolOutput(self.output, self.exit_code)


@dataclass(frozen=True)
class _Result:
    output: str
    exit_code: int | None
    timed_out: bool
    truncated: bool
    duration_s: float
    total_bytes: int


class LocalStandIn:
    """Same methods as rollout_node.sandbox's Sandbox, run as plain host processes in ``workdir``
    (no isolation; used only where the real sandbox is not available)."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir

    def _proc(self, argv: list[str], timeout_s: float | None, stdin: str | None = None) -> _Result:
        t0 = time.perf_counter()
        try:
            p = subprocess.run(argv, cwd=self.workdir, input=stdin, capture_output=True, text=True,
                               timeout=timeout_s)
            out, code, timed_out = p.stdout + p.stderr, p.returncode, False
        except subprocess.TimeoutExpired as exc:
            out, code, timed_out = str(exc.stdout or ""), None, True
        return _Result(out, code, timed_out, False, time.perf_counter() - t0, len(out))

    def run(self, command: str, *, timeout_s: float | None = None) -> _Result:
        return self._proc(["bash", "-c", command], timeout_s)

    def python(self, code: str, *, timeout_s: float | None = None) -> _Result:
        return self._proc([sys.executable, "-"], timeout_s, stdin=code)

    def exec(self, argv: list[str], *, timeout_s: float | None = None) -> _Result:
        if argv and argv[0] == "python3":
            argv = [sys.executable, *argv[1:]]
        return self._proc(argv, timeout_s)

    def close(self) -> None:
        pass

    def __enter__(self) -> LocalStandIn:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
