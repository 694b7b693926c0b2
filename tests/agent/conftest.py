"""Fixtures of the agent tests: one tiny model (tokenizer + Qwen2) per session; real bwrap sandboxes."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_helpers import build_tiny

from rollout_node.agent import ChatTemplate


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def template(tiny_model_dir: Path) -> ChatTemplate:
    return ChatTemplate.from_model_dir(tiny_model_dir)


def _sandbox_missing() -> str | None:
    try:
        from rollout_node.sandbox import default_image, open_sandbox  # noqa: F401
    except ImportError as exc:
        return f"component unavailable: rollout_node.sandbox ({exc})"
    if shutil.which("bwrap") is None:
        return "component unavailable: bwrap is not installed"
    if not Path(default_image()).exists():
        return f"component unavailable: test image {default_image()} (run scripts/build_image.sh)"
    return None


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


@pytest.fixture
def open_real_sandbox() -> Iterator[Callable[[Path], Any]]:
    """Opens real bwrap sandboxes on work dirs (closed at teardown); skips when bwrap/the image is missing."""
    reason = _sandbox_missing()
    if reason:
        pytest.skip(reason)
    from hpc.config.sandbox import SandboxConfig
    from rollout_node.sandbox import open_sandbox

    opened: list[Any] = []

    def _open(workdir: Path) -> Any:
        sb = open_sandbox(SandboxConfig(), workdir)
        opened.append(sb)
        return sb

    yield _open
    for sb in opened:
        sb.close()
