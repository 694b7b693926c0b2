"""Fixtures of the agent tests: one tiny model (tokenizer + Qwen2) per session; real bwrap sandboxes."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout_node.agent import ChatTemplate
from tests.agent.agent_helpers import build_tiny, sandbox_missing


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def template(tiny_model_dir: Path) -> ChatTemplate:
    return ChatTemplate.from_model_dir(tiny_model_dir)


@pytest.fixture
def open_real_sandbox() -> Iterator[Callable[[Path], Any]]:
    """Opens real bwrap sandboxes on work dirs (closed at teardown); skips when bwrap/the image is missing."""
    reason = sandbox_missing()
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
