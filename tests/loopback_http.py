"""Test stand-in servers on loopback: aiohttp routes served on a thread of their own
(:class:`hpc.httpserver.HttpServer`, the project's one server base), and the token-ID completion answer
(vLLM's ``/v1/completions`` with ``return_token_ids``) the rollout nodes read. The wire bodies are written
here from the documented fields, not with the project's wire code (the ProRL conformance test relies on
that); only the server plumbing is the project's."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from aiohttp import web

from hpc.httpserver import HttpServer


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
