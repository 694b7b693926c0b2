"""Test stand-in servers on loopback: an aiohttp app on a thread of its own, and the token-ID completion
answer (vLLM's ``/v1/completions`` with ``return_token_ids``) the rollout nodes read. Test code only: the
ProRL conformance test uses it without importing the project."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any

from aiohttp import web


def serve_in_thread(routes: Sequence[web.AbstractRouteDef], *, client_max_size: int = 64 * 2**20) -> str:
    """Serve ``routes`` on 127.0.0.1 (a free port) from a daemon thread; the base URL once it listens."""
    ready: list[str] = []

    async def main() -> None:
        app = web.Application(client_max_size=client_max_size)
        app.add_routes(routes)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        ready.append(f"http://127.0.0.1:{runner.addresses[0][1]}")
        await asyncio.Event().wait()

    threading.Thread(target=lambda: asyncio.run(main()), daemon=True).start()
    while not ready:
        time.sleep(0.01)
    return ready[0]


def completion_answer(prompt: list[int], ids: list[int], logprobs: list[float]) -> dict[str, Any]:
    """One choice of generated ``ids`` (processed logprobs, all of policy version 1) for ``prompt``."""
    choice = {"index": 0, "text": "", "token_ids": ids, "prompt_token_ids": prompt, "finish_reason": "stop",
              "logprobs": {"token_logprobs": logprobs}, "logprobs_mode": "processed_logprobs",
              "weight_versions": [{"version": 1, "start": 0, "end": len(ids)}]}
    return {"id": "cmpl", "object": "text_completion", "choices": [choice]}
