"""The HTTP plumbing shared by the CPU engine's server and the authenticating proxy (torch-free):
an aiohttp server, the one async HTTP stack of the project's servers, on a thread of its own.

A route is a plain function ``Call -> Reply``: it runs on a thread of its own per request (it may
block: a generation, a call to vLLM), never on the event loop, so a slow request never holds up a
``/health`` probe (as with the thread per connection of a stdlib server).

Guarantees:
- :class:`HttpServer` listens on TCP (``port`` 0 = any free port; IPv6 for a host with ``:``) or on a
  Unix socket (created with mode 0600), HTTP/1.1 keep-alive; :meth:`HttpServer.start` returns once the
  socket listens, :meth:`HttpServer.close` stops it.
- :func:`authorized` compares the bearer token in constant time; a missing secret refuses all.
- Answers are JSON with a Content-Length. A route's exception never drops the connection: it becomes
  a 500 in vLLM's error shape (a JSON error of the body, or a too deep one, a 400). A declared body
  over ``MAX_BODY_BYTES`` gets 413 before any of it is read, and the connection is closed; a
  malformed or negative Content-Length is refused with 400 by aiohttp's parser (a text body).
- ``Call.gone()`` tells a route that its client hung up while it works (the route may stop early).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import os
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from train_node.infer.protocol import error_json

MAX_BODY_BYTES = 64 * 2**20  # a token-ID prompt of 128k tokens is ~1 MB of JSON
SHUTDOWN_S = 2.0  # close() waits this long for requests in flight, then drops them


@dataclass(frozen=True)
class Call:
    """One request as a route sees it: read completely on the event loop, handled in a worker."""

    method: str
    path: str  # without the query string
    raw_path: str  # as the client sent it, with the query string (the proxy forwards it verbatim)
    headers: Mapping[str, str]
    body: bytes
    gone: Callable[[], bool] = lambda: False  # the client closed its connection

    def json(self) -> Any:
        """The body as JSON (``None`` when empty); a bad body raises (a 400 for the client)."""
        return json.loads(self.body or b"null")


@dataclass(frozen=True)
class Reply:
    status: int
    body: Any = None  # JSON, unless ``raw`` is given
    raw: bytes | None = None  # sent as is (``application/json``)
    headers: dict[str, str] = field(default_factory=dict)


Route = Callable[[Call], Reply]


def json_reply(status: int, body: Any) -> Reply:
    return Reply(status, body)


def error_reply(status: int, message: str) -> Reply:
    return Reply(status, error_json(message, status))


def authorized(header: str | None, secret: str | None) -> bool:
    if not secret or not header or not header.startswith("Bearer "):
        return False
    return hmac.compare_digest(header[len("Bearer "):].strip().encode(), secret.encode())


def read_secret(path: str | Path | None) -> str | None:
    if not path:
        return os.environ.get("SPOOLRL_SECRET") or None
    text = Path(path).read_text().strip()
    return text or None


def _listen(host: str, port: int, uds: str | None) -> socket.socket:
    """A bound socket: the Unix one is 0600 (only this user can connect) from the moment it exists."""
    if uds:
        Path(uds).unlink(missing_ok=True)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            sock.bind(uds)
        finally:
            os.umask(old)
        return sock
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    return sock


class HttpServer:
    """``route`` served by aiohttp on a thread of its own (see the module docstring)."""

    def __init__(self, route: Route, *, host: str = "127.0.0.1", port: int = 0, uds: str | None = None) -> None:
        self.route, self.host, self.uds = route, host, uds
        self._sock = _listen(host, port, uds)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="http-server", daemon=True)
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

    def start(self) -> HttpServer:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(timeout=60)
        return self

    async def _start(self) -> None:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=SHUTDOWN_S)
        await self._runner.setup()
        await web.SockSite(self._runner, self._sock, backlog=128).start()

    def close(self) -> None:
        """Stop listening and serving (idempotent): requests in flight get ``SHUTDOWN_S`` seconds to be
        answered, then their connections are dropped (their routes' threads end on their own)."""
        if self._loop.is_closed():
            return
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(timeout=60)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30)
        self._loop.close()
        self._sock.close()
        if self.uds:
            Path(self.uds).unlink(missing_ok=True)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        declared = request.content_length or 0
        if declared > MAX_BODY_BYTES:
            resp = _response(error_reply(413, f"request body of {declared} bytes is over the limit of "
                                              f"{MAX_BODY_BYTES} bytes"))
            resp.force_close()  # the body was not read: the stream cannot be reused
            return resp
        body = await request.read()
        call = Call(request.method, request.path, request.raw_path, request.headers, body,
                    gone=lambda: request.transport is None or request.transport.is_closing())
        return _response(await _in_thread(self.route, call))


def _in_thread(route: Route, call: Call) -> asyncio.Future[Reply]:
    """The reply of ``route(call)``, computed on a new daemon thread."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Reply] = loop.create_future()

    def work() -> None:
        reply = _answer(route, call)
        try:
            loop.call_soon_threadsafe(_settle, done, reply)
        except RuntimeError:
            pass  # the server closed meanwhile: nobody waits for this reply

    threading.Thread(target=work, name="http-route", daemon=True).start()
    return done


def _settle(done: asyncio.Future[Reply], reply: Reply) -> None:
    if not done.done():  # not cancelled by the server's shutdown
        done.set_result(reply)


def _answer(route: Route, call: Call) -> Reply:
    """The route's reply; its exceptions as error replies (bad JSON 400, anything else 500)."""
    try:
        return route(call)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        return error_reply(400, f"invalid JSON body: {type(exc).__name__}: {exc}")
    except Exception as exc:
        return error_reply(500, f"{type(exc).__name__}: {exc}")


def _response(reply: Reply) -> web.Response:
    data = reply.raw if reply.raw is not None else json.dumps(reply.body).encode()
    return web.Response(status=reply.status, body=data, content_type="application/json", headers=reply.headers)
