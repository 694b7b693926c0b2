"""The request plumbing shared by the CPU engine's server and the authenticating proxy (torch-free): an
aiohttp application (:func:`route_app`) that :class:`hpc.httpserver.HttpServer` serves on a thread of its own.

A route is a plain function ``Call -> Reply``: it runs on a thread of its own per request (it may
block: a generation, a call to vLLM), never on the event loop, so a slow request never holds up a
``/health`` probe (as with the thread per connection of a stdlib server).

Guarantees:
- Listening, start and stop are :class:`hpc.httpserver.HttpServer`'s (TCP or a 0600 Unix socket).
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
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from train_node.infer.protocol import error_json

MAX_BODY_BYTES = 64 * 2**20  # a token-ID prompt of 128k tokens is ~1 MB of JSON


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


def route_app(route: Route) -> web.Application:
    """An application answering every method and path with ``route`` (served by
    :class:`hpc.httpserver.HttpServer`)."""

    async def handle(request: web.Request) -> web.StreamResponse:
        declared = request.content_length or 0
        if declared > MAX_BODY_BYTES:
            resp = _response(error_reply(413, f"request body of {declared} bytes is over the limit of "
                                              f"{MAX_BODY_BYTES} bytes"))
            resp.force_close()  # the body was not read: the stream cannot be reused
            return resp
        body = await request.read()
        call = Call(request.method, request.path, request.raw_path, request.headers, body,
                    gone=lambda: request.transport is None or request.transport.is_closing())
        return _response(await _in_thread(route, call))

    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


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
