"""A scriptable stand-in for the inference API, for the client's failure-path tests.

It speaks the same ``/v1/completions`` subset as ``spoolrl serve`` but "generates" deterministic IDs
from the prompt, so tests can make it fail (status codes, malformed bodies, delays, death) on cue.
Served by :class:`hpc.httpserver.HttpServer` (aiohttp, the project's one server stack). Run in-process
(:class:`FakeEngine`) or as a process: ``python fake_engine.py --port 0 --ready-file F`` (``--uds PATH``
for a Unix socket; the checkout on PYTHONPATH) so that a test can SIGKILL it in the middle of a request.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from hpc.httpserver import HttpServer


class FakeEngine:
    """State + behaviour knobs; ``script`` holds per-request overrides consumed in order."""

    def __init__(self, *, version: int = 1, delay_s: float = 0.0, spans: str = "ok") -> None:
        self.version = version
        self.delay_s = delay_s
        self.spans = spans           # "ok" | "missing" | "split" (two spans: version, version + 1)
        self.script: list[int] = []  # HTTP statuses to answer before behaving (e.g. [503, 503])
        self.requests: list[dict[str, Any]] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.lock = threading.Lock()
        self.server: HttpServer | None = None

    def generate(self, body: dict[str, Any]) -> dict[str, Any]:
        prompt, n = body["prompt"], int(body.get("max_tokens", 16))
        base = sum(prompt) + int(body.get("seed") or 0)
        ids = [10 + (base + 7 * i) % 50 for i in range(n)]
        spans = [{"version": self.version, "start": 0, "end": n}]
        if self.spans == "split" and n > 1:
            spans = [{"version": self.version, "start": 0, "end": n // 2},
                     {"version": self.version + 1, "start": n // 2, "end": n}]
        choice: dict[str, Any] = {"index": 0, "text": "", "token_ids": ids, "prompt_token_ids": prompt,
                                  "logprobs": {"token_logprobs": [-1.0] * n}, "finish_reason": "length"}
        if self.spans != "missing":
            choice["weight_versions"] = spans
        return {"id": "cmpl-fake", "object": "text_completion", "model": "fake", "choices": [choice]}

    async def _get(self, request: web.Request) -> web.Response:
        if request.path == "/v1/models":
            return web.json_response({"data": [{"id": "fake", "max_model_len": 4096}]})
        return web.json_response({"status": "ok"})

    async def _post(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        with self.lock:
            self.requests.append(body)
            status = self.script.pop(0) if self.script else 200
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay_s)
            return web.json_response(self.generate(body) if status == 200 else {"error": {"code": status}},
                                     status=status)
        finally:
            with self.lock:
                self.in_flight -= 1

    def start(self, *, uds: str | None = None) -> str:
        app = web.Application()
        app.add_routes([web.get("/{tail:.*}", self._get), web.post("/{tail:.*}", self._post)])
        self.server = HttpServer(app, uds=uds).start()
        return self.server.url

    def stop(self) -> None:
        """Stop serving: kept-alive connections are dropped too (a dead server, as the client sees it)."""
        if self.server is not None:
            self.server.close()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--uds")
    ap.add_argument("--ready-file", required=True)
    ap.add_argument("--delay-s", type=float, default=0.0)
    ap.add_argument("--version", type=int, default=1)
    a = ap.parse_args()
    url = FakeEngine(version=a.version, delay_s=a.delay_s).start(uds=a.uds)
    tmp = a.ready_file + ".tmp"
    Path(tmp).write_text(json.dumps({"url": url, "pid": os.getpid()}))
    os.replace(tmp, a.ready_file)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    sys.exit(main())
