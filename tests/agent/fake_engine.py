"""A scriptable stand-in for the inference API (stdlib only), for the client's failure-path tests.

It speaks the same ``/v1/completions`` subset as ``spoolrl serve`` but "generates" deterministic IDs
from the prompt, so tests can make it fail (status codes, malformed bodies, delays, death) on cue.
Run in-process (:class:`FakeEngine`) or as a process: ``python fake_engine.py --port 0 --ready-file F``
(``--uds PATH`` for a Unix socket) so that a test can SIGKILL it in the middle of a request.
"""

from __future__ import annotations

import argparse
import json
import os
import socketserver
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


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
        self.server: Any = None
        self.stopped = False  # a stopped engine drops even kept-alive connections without answering

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

    def handler(self) -> type[BaseHTTPRequestHandler]:
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, status: int, obj: Any) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802
                if engine.stopped:
                    self.close_connection = True
                    return
                if self.path == "/v1/models":
                    self._send(200, {"data": [{"id": "fake", "max_model_len": 4096}]})
                else:
                    self._send(200, {"status": "ok"})

            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                if engine.stopped:
                    self.close_connection = True
                    return
                with engine.lock:
                    engine.requests.append(body)
                    status = engine.script.pop(0) if engine.script else 200
                    engine.in_flight += 1
                    engine.max_in_flight = max(engine.max_in_flight, engine.in_flight)
                try:
                    time.sleep(engine.delay_s)
                    self._send(status, engine.generate(body) if status == 200 else {"error": {"code": status}})
                finally:
                    with engine.lock:
                        engine.in_flight -= 1

        return Handler

    def start(self, *, uds: str | None = None) -> str:
        if uds:
            self.server = _UnixServer(uds, self.handler())
            url = f"unix://{uds}"
        else:
            self.server = ThreadingHTTPServer(("127.0.0.1", 0), self.handler())
            self.server.daemon_threads = True
            url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return url

    def stop(self) -> None:
        self.stopped = True
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()


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
