"""Fixtures of the agent tests: one tiny model (tokenizer + Qwen2) per session."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_helpers import build_tiny

from rollout_node.agent import ChatTemplate


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="session")
def template(tiny_model_dir: Path) -> ChatTemplate:
    return ChatTemplate.from_model_dir(tiny_model_dir)
