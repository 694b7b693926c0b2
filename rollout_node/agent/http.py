"""Minimal JSON-over-HTTP transport to one server, over TCP or a Unix domain socket (stdlib only).

URLs: ``http://HOST:PORT`` (TCP) or ``unix:///abs/path.sock`` (a Unix socket; node-internal traffic).

Guarantees:
- Keep-alive connections are pooled per server (one per in-flight request); a connection that
  saw any error is closed, never reused. A pooled connection the server closed while idle is
  retried once on a fresh connection (that is keep-alive housekeeping, not a failure).
- With a ``token`` every request carries ``Authorization: Bearer <token>`` (the run secret: the
  run's inference servers require it on every route but ``/health`` by default).
- Abortable: with ``abort`` (a callable), the wait for the answer is cut into 0.25-s slices and, when
  ``abort()`` turns true (the episode was cancelled or stopped), the connection is closed and
  :class:`RequestAborted` raised at once, rather than holding the caller until the server answers or
  the timeout passes. The whole wait stays bounded by the transport's timeout.
- Failures are classified: :class:`TransientHTTPError` (connect refused/reset, timeout, 408/429/5xx,
  unreadable body: worth a retry or a failover) vs :class:`FatalHTTPError` (other 4xx: the request
  itself is wrong; retrying cannot help).
"""

from __future__ import annotations

import http.client
import json
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})


class TransientHTTPError(Exception):
    """The server did not answer usefully this time; another try (or server) may work."""


class FatalHTTPError(Exception):
    """The server rejected the request itself (4xx); the same request will fail again."""


class RequestAborted(Exception):
    """The caller's ``abort()`` turned true while its request was in flight; the connection was closed."""


class UnixHTTPConnection(http.client.HTTPConnection):
    """``http.client`` over a Unix domain socket."""

    def __init__(self, socket_path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def _connection_factory(url: str, timeout_s: float) -> Any:
    parts = urlsplit(url)
    if parts.scheme == "unix":
        path = parts.path
        return lambda: UnixHTTPConnection(path, timeout_s)
    if parts.scheme == "http" and parts.hostname:
        host, port = parts.hostname, parts.port or 80
        return lambda: http.client.HTTPConnection(host, port, timeout=timeout_s)
    raise ValueError(f"unsupported server URL {url!r}; use http://HOST:PORT or unix:///path.sock")


class HTTPTransport:
    """JSON requests to one server with a small pool of keep-alive connections."""

    def __init__(self, url: str, *, timeout_s: float, max_idle: int = 16, token: str | None = None) -> None:
        self.url = url
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}
        self._new = _connection_factory(url, timeout_s)
        self.timeout_s = timeout_s
        self._idle: list[http.client.HTTPConnection] = []
        self._lock = threading.Lock()
        self.max_idle = max_idle

    def _take(self) -> tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        return self._new(), False

    def _give_back(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._idle) < self.max_idle:
                self._idle.append(conn)
                return
        conn.close()

    def request(self, method: str, path: str, body: dict[str, Any] | None = None,
                abort: Callable[[], bool] | None = None) -> Any:
        """Send one request; the decoded JSON answer, or a Transient/FatalHTTPError (RequestAborted when
        ``abort()`` turned true while waiting)."""
        payload = json.dumps(body).encode() if body is not None else None
        conn, reused = self._take()
        try:
            status, data = self._roundtrip(conn, method, path, payload, abort)
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as exc:
            conn.close()
            if not reused:
                raise TransientHTTPError(f"{self.url}: connection lost ({exc!r})") from exc
            conn = self._new()  # the server had closed the idle keep-alive connection
            status, data = self._guarded(conn, method, path, payload, abort)
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise TransientHTTPError(f"{self.url}: {exc!r}") from exc
        self._give_back(conn)
        return _decode(self.url, path, status, data)

    def _guarded(self, conn: http.client.HTTPConnection, method: str, path: str,
                 payload: bytes | None, abort: Callable[[], bool] | None) -> tuple[int, bytes]:
        try:
            return self._roundtrip(conn, method, path, payload, abort)
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise TransientHTTPError(f"{self.url}: {exc!r}") from exc

    def _roundtrip(self, conn: http.client.HTTPConnection, method: str, path: str, payload: bytes | None,
                   abort: Callable[[], bool] | None) -> tuple[int, bytes]:
        headers = {"Content-Type": "application/json", **self._auth} if payload is not None else dict(self._auth)
        conn.request(method, path, body=payload, headers=headers)
        if abort is not None:
            self._await_answer(conn, abort)
        resp = conn.getresponse()
        return resp.status, resp.read()

    def _await_answer(self, conn: http.client.HTTPConnection, abort: Callable[[], bool]) -> None:
        """Until the answer's first bytes arrive: check ``abort()`` every 0.25 s (and when it turns
        true, close the connection and raise RequestAborted); the whole wait bounded by the timeout, as a blocking read is."""
        end = time.monotonic() + self.timeout_s
        readable = select.poll()  # not select(): a node with many episodes has descriptors above 1024
        readable.register(conn.sock, select.POLLIN)
        while not readable.poll(1000 * min(0.25, max(0.0, end - time.monotonic()))):
            if abort():
                conn.close()
                raise RequestAborted(f"{self.url}: the request was abandoned while in flight")
            if time.monotonic() >= end:
                raise TimeoutError(f"no answer within {self.timeout_s:g} s")

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


def _decode(url: str, path: str, status: int, data: bytes) -> Any:
    snippet = data[:300].decode("utf-8", "replace")
    if status in RETRYABLE_STATUS:
        raise TransientHTTPError(f"{url}{path}: HTTP {status}: {snippet}")
    if status >= 400:
        raise FatalHTTPError(f"{url}{path}: HTTP {status}: {snippet}")
    try:
        return json.loads(data)
    except ValueError as exc:
        raise TransientHTTPError(f"{url}{path}: unreadable JSON body ({snippet!r})") from exc
