"""Test stand-in servers on loopback: aiohttp routes served on a thread of their own
(:class:`hpc.httpserver.HttpServer`, the project's one server base), the token-ID completion answer (vLLM's
``/v1/completions`` with ``return_token_ids``) the rollout nodes read, and :class:`RecordingLLM`, a
``/v1/completions`` backend that answers through a reply hook and records every call. The wire bodies are
written here from the documented fields, not with the project's wire code (the ProRL conformance test
relies on that); only the server plumbing is the project's."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any

from aiohttp import web

from hpc.httpserver import HttpServer

ReplyHook = Callable[[list[int], int], list[int]]  # (prompt IDs, index of the call) -> the IDs to generate


def serve_in_thread(routes: Sequence[web.AbstractRouteDef], *, client_max_size: int = 64 * 2**20) -> str:
    """Serve ``routes`` on 127.0.0.1 (a free port) from a daemon thread; the base URL once it listens."""
    app = web.Application(client_max_size=client_max_size)
    app.add_routes(routes)
    return HttpServer(app).start().url


def completion_answer(prompt: list[int], ids: list[int], logprobs: list[float]) -> dict[str, Any]:
    """One choice of generated ``ids`` (processed logprobs, all of policy version 1) for ``prompt``."""
    choice = {"index": 0, "text": "", "token_ids": ids, "prompt_token_ids": prompt, "finish_reason": "stop",
              "logprobs": {"token_logprobs": logprobs}, "logprobs_mode": "processed_logprobs",
              "weight_versions": [{"version": 1, "start": 0, "end": len(ids)}]}
    return {"id": "cmpl", "object": "text_completion", "choices": [choice]}


class RecordingLLM:
    """A ``/v1/completions`` server taking token-ID prompts: call ``i`` generates ``reply(prompt, i)`` (cut at
    ``max_tokens``), its ``j``-th token with logprob ``logprob0 - 0.001 * j``. ``seen`` records every call:
    ``{"prompt", "token_ids", "logprobs", "temperature", "top_p", "max_tokens"}``. While ``hold`` is set,
    every request is parked unanswered (``held`` counts them)."""

    def __init__(self, reply: ReplyHook, *, logprob0: float, max_model_len: int) -> None:
        self.reply, self.logprob0, self.max_model_len = reply, logprob0, max_model_len
        self.seen: list[dict[str, Any]] = []
        self.held = 0
        self.hold = threading.Event()

    async def complete(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.hold.is_set():
            self.held += 1
            while self.hold.is_set():
                await asyncio.sleep(0.05)
        prompt = [int(i) for i in body["prompt"]]
        ids = self.reply(prompt, len(self.seen))[: int(body["max_tokens"])]
        logprobs = [self.logprob0 - 0.001 * j for j in range(len(ids))]
        self.seen.append({"prompt": prompt, "token_ids": ids, "logprobs": logprobs, "temperature": body.get("temperature"),
                          "top_p": body.get("top_p"), "max_tokens": body["max_tokens"]})
        return web.json_response(completion_answer(prompt, ids, logprobs))

    async def models(self, _request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "recording", "max_model_len": self.max_model_len}]})

    def serve(self) -> str:
        """Start on a thread of its own; returns the base URL."""
        return serve_in_thread([web.post("/v1/completions", self.complete), web.get("/v1/models", self.models)])
