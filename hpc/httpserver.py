"""An aiohttp application served from an event loop on a thread of its own: the one async HTTP stack of
every spoolrl server (the gateway, the CPU engine and the auth proxy, the stand-in LLM, the tests' stand-ins),
so a synchronous caller starts and stops a server with two calls.

Guarantees:
- The socket is bound when the :class:`HttpServer` is made (so ``port`` is known before :meth:`start`, and
  a taken port or path raises ``OSError`` there): TCP (``port`` 0 = any free port; IPv6 for a host with
  ``:``) or a Unix socket. A Unix socket's file is mode 0600 before it listens (only this user can ever
  connect), a stale socket file at its path is replaced, any other file there is left alone (bind fails).
- :meth:`HttpServer.start` returns once the socket listens (HTTP/1.1 keep-alive); the application's
  handlers run on the server's loop.
- :meth:`HttpServer.close` is idempotent: it stops listening, gives requests in flight
  ``shutdown_timeout_s`` to be answered, drops their connections, stops the loop, joins its thread and
  removes the socket file.
"""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from pathlib import Path

from aiohttp import web

SHUTDOWN_S = 2.0  # close() waits this long for requests in flight, then drops them


def _listen_unix(path: str) -> socket.socket:
    """A Unix socket bound at ``path``, mode 0600. Nobody can connect before ``listen()`` (which the site
    calls), so the mode is set in time without touching the process-wide umask."""
    if Path(path).is_socket():
        Path(path).unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.bind(path)
        os.chmod(path, 0o600)
    except BaseException:
        sock.close()
        raise
    return sock


def _listen_tcp(host: str, port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except BaseException:
        sock.close()
        raise
    return sock


class HttpServer:
    """``app`` served on ``host:port`` or the Unix socket ``uds`` (see the module docstring)."""

    def __init__(self, app: web.Application, *, host: str = "127.0.0.1", port: int = 0, uds: str | None = None,
                 backlog: int = 128, shutdown_timeout_s: float = SHUTDOWN_S, name: str = "http-server") -> None:
        self.app, self.host, self.uds, self.backlog = app, host, uds, backlog
        self.shutdown_timeout_s = shutdown_timeout_s
        self._sock = _listen_unix(uds) if uds else _listen_tcp(host, port)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._runner: web.AppRunner | None = None

    @property
    def port(self) -> int:
        return int(self._sock.getsockname()[1]) if not self.uds else 0

    @property
    def url(self) -> str:
        """The URL a client on this host uses (``unix:///abs/path.sock`` for a Unix socket)."""
        if self.uds:
            return f"unix://{os.path.abspath(self.uds)}"
        shown = "127.0.0.1" if self.host in ("0.0.0.0", "") else f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{shown}:{self.port}"

    def start(self, timeout_s: float = 60.0) -> HttpServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=timeout_s)
        return self

    async def _start(self) -> None:
        self._runner = web.AppRunner(self.app, access_log=None, handle_signals=False,
                                     shutdown_timeout=self.shutdown_timeout_s)
        await self._runner.setup()
        await web.SockSite(self._runner, self._sock, backlog=self.backlog).start()

    def close(self) -> None:
        """Stop listening and serving (idempotent): requests in flight get ``shutdown_timeout_s`` seconds to
        be answered, then their connections are dropped."""
        if self._loop.is_closed():
            return
        if self._runner is not None:
            cleanup = asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop)
            cleanup.result(timeout=self.shutdown_timeout_s + 30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        self._loop.close()
        self._sock.close()
        if self.uds:
            Path(self.uds).unlink(missing_ok=True)
