"""Stdlib HTTP plumbing shared by the CPU engine's server and the authenticating proxy (torch-free).

Guarantees:
- :func:`make_server` listens on TCP (``port`` 0 = any free port) or on a Unix socket (created
  with mode 0600 inside its directory), one thread per connection, HTTP/1.1 keep-alive.
- :func:`authorized` compares the bearer token in constant time; a missing secret refuses all.
- :class:`JsonHandler` answers JSON with a Content-Length and never lets a handler exception
  escape as a dropped connection: it becomes a 500 in vLLM's error shape. A request body over
  ``MAX_BODY_BYTES`` gets 413 and a missing-digit or negative Content-Length 400, before any of it
  is read (so one client cannot make a server buffer gigabytes or block on ``read(-1)``).
"""

from __future__ import annotations

import hmac
import json
import os
import socket
import socketserver
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from train_node.infer.protocol import error_json

MAX_BODY_BYTES = 64 * 2**20  # a token-ID prompt of 128k tokens is ~1 MB of JSON


class BadBody(Exception):
    """A request body that is refused before it is read (status 400 or 413)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _UnixHTTPServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    allow_reuse_address = True

    def server_bind(self) -> None:
        path = Path(str(self.server_address))
        path.unlink(missing_ok=True)
        old = os.umask(0o177)  # the socket file is 0600: only this user can connect
        try:
            super().server_bind()
        finally:
            os.umask(old)


class _TcpHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128


class _Tcp6HTTPServer(_TcpHTTPServer):
    address_family = socket.AF_INET6


def make_server(handler: type[BaseHTTPRequestHandler], *, host: str = "127.0.0.1", port: int = 0,
                uds: str | None = None) -> socketserver.BaseServer:
    if uds:
        return _UnixHTTPServer(uds, handler)
    cls = _Tcp6HTTPServer if ":" in host else _TcpHTTPServer
    return cls((host, port), handler)


def server_url(server: socketserver.BaseServer, host: str) -> str:
    """The URL a client on this host uses (``unix:///abs/path.sock`` for a Unix socket)."""
    addr: Any = server.server_address
    if isinstance(addr, (str, bytes)):
        return f"unix://{os.path.abspath(addr if isinstance(addr, str) else addr.decode())}"
    shown = "127.0.0.1" if host in ("0.0.0.0", "") else f"[{host}]" if ":" in host else host
    return f"http://{shown}:{addr[1]}"


def authorized(header: str | None, secret: str | None) -> bool:
    if not secret or not header or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header[len("Bearer "):].strip().encode(), secret.encode())


def read_secret(path: str | Path | None) -> str | None:
    if not path:
        return os.environ.get("SPOOLRL_SECRET") or None
    text = Path(path).read_text().strip()
    return text or None


class JsonHandler(BaseHTTPRequestHandler):
    """Base handler: JSON in/out helpers; subclasses implement ``route(method) -> None``."""

    protocol_version = "HTTP/1.1"
    server_version = "spoolrl"

    def address_string(self) -> str:
        return str(self.client_address[0]) if self.client_address else "unix"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # access logs would swamp the node log; errors are reported in responses

    def read_json(self) -> Any:
        """The request body as JSON (``null`` when empty); see :meth:`read_body`."""
        return json.loads(self.read_body() or b"null")

    def read_body(self) -> bytes:
        """The request body; a bad or over-cap Content-Length raises :class:`BadBody` before reading."""
        raw_length = (self.headers.get("Content-Length") or "0").strip()
        if not (raw_length.isascii() and raw_length.isdigit()) or len(raw_length) > 12:
            raise BadBody(400, f"invalid Content-Length {raw_length[:20]!r}")
        n = int(raw_length)
        if n > MAX_BODY_BYTES:
            raise BadBody(413, f"request body of {n} bytes is over the limit of {MAX_BODY_BYTES} bytes")
        return self.rfile.read(n) if n else b""

    def send_json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def send_error_json(self, status: int, message: str) -> None:
        self.send_json(status, error_json(message, status))

    def route(self, method: str) -> None:
        raise NotImplementedError

    def _dispatch(self, method: str) -> None:
        try:
            self.route(method)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client went away; nothing to answer
        except BadBody as exc:
            self.close_connection = True  # the body was not read: the stream cannot be reused
            self.send_error_json(exc.status, str(exc))
        except (json.JSONDecodeError, RecursionError) as exc:
            self.send_error_json(400, f"invalid JSON body: {type(exc).__name__}: {exc}")
        except Exception as exc:
            self.send_error_json(500, f"{type(exc).__name__}: {exc}")

    def do_GET(self) -> None:  # noqa: N802 - stdlib naming
        self._dispatch("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch("POST")
