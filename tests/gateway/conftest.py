"""Fixtures of the gateway tests: the tiny model's chat template, a recording backend, one gateway."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout_node.agent.client import InferenceClient
from rollout_node.agent.template import ChatTemplate
from rollout_node.gateway import Gateway
from tests.gateway.gw_helpers import RecordingBackend
from train_node.infer.tiny import cached_tiny_model

REPLY = 'Listing.\n<tool_call>\n{"name": "bash", "arguments": {"command": "ls"}}\n</tool_call><|im_end|>'


@pytest.fixture(scope="session")
def template() -> ChatTemplate:
    return ChatTemplate.from_model_dir(cached_tiny_model())


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory, template: ChatTemplate) -> Iterator[RecordingBackend]:
    b = RecordingBackend(tmp_path_factory.mktemp("backend") / "record.jsonl", template.encode(REPLY))
    yield b
    b.close()


@pytest.fixture(scope="module")
def client(backend: RecordingBackend) -> Iterator[InferenceClient]:
    c = InferenceClient([backend.url], seed=0)
    yield c
    c.close()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    gw = Gateway(Path(tmp_path_factory.mktemp("gw")) / "gateway.sock", model="policy").start()
    yield gw
    gw.close()
