"""Test doubles for the agent tests: a scripted ID policy, recording tools; the tiny model builder."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rollout_node.agent import ChatTemplate, Completion, SamplingParams, ToolCall, ToolOutput


def build_tiny(path: Path, seed: int = 0) -> Path:
    from train_node.infer.tiny import build_tiny_model

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
    submitted: bool = False

    def execute(self, call: ToolCall) -> ToolOutput:
        self.calls.append(call)
        if self.error is not None:
            raise self.error
        return ToolOutput(self.output, self.exit_code)

    def submit(self) -> ToolOutput:
        self.submitted = True
        return ToolOutput("diff")


def sandbox_missing() -> str | None:
    try:
        from rollout_node.sandbox import bwrap_unavailable_reason
    except ImportError as exc:
        return f"component unavailable: rollout_node.sandbox ({exc})"
    return bwrap_unavailable_reason() or None


def git_repo(path: Path, files: dict[str, str]) -> Path:
    """A small committed git repository (what INIT prepares for an episode)."""
    path.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    env = ["-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", "."], cwd=path, check=True)
    subprocess.run(["git", "add", "-A"], cwd=path, check=True)
    subprocess.run(["git", *env, "commit", "-qm", "init"], cwd=path, check=True)
    return path
