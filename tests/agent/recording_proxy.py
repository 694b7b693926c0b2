"""A recording HTTP proxy for tests: forwards every request to one upstream server and logs the
decoded JSON request and response bodies, so a test can compare what the engine really saw and
produced with what the client recorded."""

from __future__ import annotations

import http.client
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from rollout_node.agent.http import UnixHTTPConnection


class RecordingProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.log: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    def _connect(self) -> http.client.HTTPConnection:
        u = urlsplit(self.upstream)
        if u.scheme == "unix":
            return UnixHTTPConnection(u.path, timeout=300)
        return http.client.HTTPConnection(u.hostname or "127.0.0.1", u.port, timeout=300)

    def _forward(self, method: str, path: str, body: bytes | None) -> tuple[int, bytes]:
        conn = self._connect()
        try:
            conn.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
            resp = conn.getresponse()
            return resp.status, resp.read()
        finally:
            conn.close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _relay(self, method: str) -> None:
                n = int(self.headers.get("Content-Length", 0))
                body = self.rfile.read(n) if n else None
                status, data = proxy._forward(method, self.path, body)
                with proxy._lock:
                    proxy.log.append({"method": method, "path": self.path, "status": status,
                                      "request": json.loads(body) if body else None,
                                      "response": json.loads(data) if data else None})
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                self._relay("GET")

            def do_POST(self) -> None:  # noqa: N802
                self._relay("POST")

        return Handler

    def start(self) -> str:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def completions(self) -> list[dict[str, Any]]:
        with self._lock:
            return [e for e in self.log if e["path"] == "/v1/completions"]

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
