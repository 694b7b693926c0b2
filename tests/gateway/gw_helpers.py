"""Helpers of the gateway tests: a recording stand-in backend on loopback, and the OpenAI SDK over the socket.

The backend is :class:`rollout_node.service.standin.StandIn` (a stand-in for an LLM, which cannot run
here at test speed): the real ``/v1/completions`` token-ID protocol, fixed reply IDs, every prompt and
reply recorded. The gateway reaches it through the real :class:`InferenceClient`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import httpx2
import openai
from openai.types.chat import ChatCompletionFunctionToolParam, ChatCompletionMessageParam

from hpc.httpserver import HttpServer
from rollout_node.gateway import GatewaySession
from rollout_node.pipeline.policy import Transcript
from rollout_node.service.standin import VERSION, StandIn

LOGPROB = -0.5  # what the stand-in reports for every token
STANDIN_VERSION = VERSION

TOOLS: list[ChatCompletionFunctionToolParam] = [{"type": "function", "function": {
    "name": "bash", "description": "run a command",
    "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}]


class RecordingBackend:
    """A StandIn on 127.0.0.1 in a thread of its own; ``records()`` are its (prompt, token_ids) pairs."""

    def __init__(self, record: Path, reply: Sequence[int], latency_s: float = 0.0) -> None:
        self.record = record
        self.standin = StandIn(list(reply), latency_s, record, max_model_len=1 << 16)
        self._server = HttpServer(self.standin.app(), backlog=1024).start()
        self.url = self._server.url

    def reply(self, ids: Sequence[int]) -> None:
        """What every completion returns from now on (its first ``max_tokens`` IDs)."""
        self.standin.reply_ids = list(ids)

    def records(self) -> list[dict[str, list[int]]]:
        return [json.loads(line) for line in self.record.read_text().splitlines()] if self.record.exists() else []

    def close(self) -> None:
        self._server.close()


def sdk(session: GatewaySession, key: str | None = None) -> openai.OpenAI:
    """The official OpenAI client, over the gateway's Unix socket (the production path)."""
    transport = httpx2.HTTPTransport(uds=str(session.socket_path))
    return openai.OpenAI(api_key=key or session.key, base_url="http://gateway/v1", max_retries=0, timeout=120.0,
                         http_client=httpx2.Client(transport=transport))


def as_history(message: Any) -> ChatCompletionMessageParam:
    """An SDK response message as the harness sends it back (what LiteLLM / the SDK's users do)."""
    return cast(ChatCompletionMessageParam, message.model_dump(exclude_none=True))


def assert_exact(segment: Transcript, records: list[dict[str, list[int]]]) -> None:
    """The segment is the last prompt + its completion, and every call's prompt and reply sit in it
    exactly where the backend saw and produced them (mask 1, the backend's logprob and version)."""
    ids = segment.token_ids
    for rec in records:
        prompt, reply = rec["prompt"], rec["token_ids"]
        assert ids[:len(prompt)] == prompt
        span = slice(len(prompt), len(prompt) + len(reply))
        assert ids[span] == reply
        assert set(segment.loss_mask[span]) == {1}
        assert set(segment.logprobs[span]) == {LOGPROB} and set(segment.policy_versions[span]) == {STANDIN_VERSION}
    last = records[-1]
    assert len(ids) == len(last["prompt"]) + len(last["token_ids"])  # the reply ended with <|im_end|>
    assert sum(segment.loss_mask) == sum(len(r["token_ids"]) for r in records)
    assert segment.prompt_len == len(records[0]["prompt"])
