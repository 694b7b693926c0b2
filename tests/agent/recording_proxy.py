"""A recording HTTP proxy for tests: forwards every request to one upstream server and logs the
decoded JSON request and response bodies, so a test can compare what the engine really saw and
produced with what the client recorded. Served by :class:`hpc.httpserver.HttpServer` and forwarded with
an aiohttp client (the project's one async HTTP stack)."""

from __future__ import annotations

import json
import threading
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from hpc.httpserver import HttpServer


class RecordingProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.log: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._server: HttpServer | None = None

    async def _forward(self, method: str, path: str, body: bytes | None) -> tuple[int, bytes]:
        """One new upstream connection per request (TCP, or ``unix://PATH``)."""
        u = urlsplit(self.upstream)
        unix = u.scheme == "unix"
        base = "http://localhost" if unix else f"http://{u.hostname or '127.0.0.1'}:{u.port}"
        connector = aiohttp.UnixConnector(path=u.path) if unix else aiohttp.TCPConnector()
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:
            async with session.request(method, base + path, data=body,
                                       headers={"Content-Type": "application/json"} if body else {}) as resp:
                return resp.status, await resp.read()

    async def _relay(self, request: web.Request) -> web.Response:
        body = await request.read() or None
        status, data = await self._forward(request.method, request.raw_path, body)
        with self._lock:
            self.log.append({"method": request.method, "path": request.raw_path, "status": status,
                             "request": json.loads(body) if body else None,
                             "response": json.loads(data) if data else None})
        return web.Response(status=status, body=data, content_type="application/json")

    def start(self) -> str:
        app = web.Application(client_max_size=64 * 2**20)
        app.add_routes([web.get("/{tail:.*}", self._relay), web.post("/{tail:.*}", self._relay)])
        self._server = HttpServer(app).start()
        return self._server.url

    def completions(self) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.log if e["path"] == "/v1/completions"]

    def stop(self) -> None:
        if self._server is not None:
            self._server.close()
