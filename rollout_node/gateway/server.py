"""The gateway: one aiohttp server per rollout node on a Unix socket, one session per episode.

Guarantees:
- :meth:`Gateway.start` binds the socket (mode 0600; a stale socket file at the path is replaced) and
  serves from an asyncio loop in a thread of its own (:class:`hpc.httpserver.HttpServer`), so the
  synchronous rollout node just calls :meth:`Gateway.open_session` and :meth:`GatewaySession.close`
  from its episode threads.
- Routes: ``POST /v1/chat/completions`` (JSON, or ``stream: true`` server-sent events:
  ``chat.completion.chunk`` objects then ``data: [DONE]``; the stream is written once the backend
  answered, the backend call itself is not streamed), ``POST /v1/responses`` (the Responses API,
  :mod:`rollout_node.gateway.responses`: mapped onto the same call, the same session path and the same
  error rules) and ``GET /v1/models`` (the one model name).
- Every request needs ``Authorization: Bearer <session key>`` of an open session; any other key, or
  the key of a closed session, gets 401 (OpenAI's error body). Keys are 256-bit random secrets.
- A call blocks a worker thread (``max_workers`` of them), never the event loop; bodies are limited
  to ``max_request_mb`` (413 above).
- :meth:`Gateway.close` closes the open sessions, refuses new connections, gives calls in flight
  ``CLOSE_WAIT_S`` to end, stops the loop, joins the thread and removes the socket file.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from aiohttp import web

from hpc.httpserver import HttpServer
from rollout_node.agent.policy import Policy
from rollout_node.agent.template import ChatTemplate
from rollout_node.gateway.responses import ResponsesAnswer, ResponsesRequest, event_stream, parse_responses
from rollout_node.gateway.session import BackendFailed, GatewaySampling, GatewaySession, SessionClosed
from rollout_node.gateway.wire import ChatAnswer, ChatRequest, WireError, error_body, models_body, parse_request, sse

log = logging.getLogger("spoolrl.gateway")
MAX_SOCKET_PATH = 107  # sun_path holds 108 bytes, NUL included
CLOSE_WAIT_S = 30.0  # close() waits this long for calls in flight (their sessions are closed: they get 401)
UNAUTHORIZED = "invalid or expired session key: each episode's harness must use its own OPENAI_API_KEY"
# how one call's answer is written back: (the HTTP request, the session's answer) -> the HTTP response
Respond = Callable[[web.Request, ChatAnswer], Awaitable[web.StreamResponse]]


def _error(status: int, message: str, kind: str, code: str | None = None) -> web.Response:
    return web.json_response(error_body(message, kind=kind, code=code), status=status)


class Gateway:
    """One per rollout node (and per ``rollout-server``): sessions keyed by their secret."""

    def __init__(self, socket_path: str | Path, *, model: str = "policy", max_workers: int = 64,
                 max_request_mb: float = 64.0, start_timeout_s: float = 30.0) -> None:
        self.socket_path = Path(socket_path)
        if len(os.fsencode(self.socket_path)) > MAX_SOCKET_PATH:
            raise ValueError(f"gateway socket path {self.socket_path} is longer than {MAX_SOCKET_PATH} bytes "
                             "(a Unix socket limit); use a shorter node-local scratch directory")
        self.model, self.max_request_mb, self.start_timeout_s = model, max_request_mb, start_timeout_s
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="gateway-call")
        self._sessions: dict[str, GatewaySession] = {}
        self._lock = threading.Lock()
        self._http: HttpServer | None = None
        self._served = False  # start() ran once: a Gateway serves once

    # -- lifecycle (called from the rollout node's threads) ------------------------------------------------

    def start(self) -> Gateway:
        """Bind the socket and serve; returns once requests are accepted (raises if binding failed).
        Idempotent while serving (``with Gateway(...).start() as gw`` starts it once)."""
        if self._http is not None:
            return self
        if self._served:
            raise RuntimeError("a Gateway serves once: make a new one after close()")
        self._served = True
        self.socket_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._http = HttpServer(self._app(), uds=str(self.socket_path), shutdown_timeout_s=CLOSE_WAIT_S,
                                    name="spoolrl-gateway").start(timeout_s=self.start_timeout_s)
        except TimeoutError as exc:  # an OSError: caught first
            raise RuntimeError(f"gateway on {self.socket_path} did not start within {self.start_timeout_s} s") from exc
        except OSError as exc:
            raise RuntimeError(f"gateway on {self.socket_path} failed to start: {exc}") from exc
        return self

    def _app(self) -> web.Application:
        app = web.Application(client_max_size=int(self.max_request_mb * 2**20))
        app.add_routes([web.post("/v1/chat/completions", self._chat), web.post("/v1/responses", self._responses),
                        web.get("/v1/models", self._models)])
        return app

    def open_session(self, episode_key: str, client_session: Policy, template: ChatTemplate,
                     sampling: GatewaySampling) -> GatewaySession:
        """A new session for one episode: ``client_session`` is its backend (e.g. the inference client's
        :class:`~rollout_node.agent.client.EpisodeSession`), ``template`` the model's chat pieces."""
        if self._http is None:
            raise RuntimeError("Gateway.open_session before start()")
        key = "sk-spoolrl-" + secrets.token_urlsafe(32)
        session = GatewaySession(key=key, episode_key=episode_key, socket_path=self.socket_path, model=self.model,
                                 backend=client_session, template=template, sampling=sampling,
                                 on_close=self._forget)
        with self._lock:
            self._sessions[key] = session
        return session

    def _forget(self, key: str) -> None:
        with self._lock:
            self._sessions.pop(key, None)

    def session_count(self) -> int:
        with self._lock:
            return len(self._sessions)

    def close(self) -> None:
        """Stop serving (idempotent); sessions still open are closed."""
        with self._lock:
            open_sessions = list(self._sessions.values())
        for session in open_sessions:
            session.close()
        if self._http is not None:
            self._http.close()
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._http = None

    def __enter__(self) -> Gateway:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- the routes (on the server's loop) -----------------------------------------------------------------

    def _session_of(self, request: web.Request) -> GatewaySession | None:
        header = request.headers.get("Authorization", "")
        key = header[7:].strip() if header[:7].lower() == "bearer " else ""
        with self._lock:
            session = self._sessions.get(key)
        return session if session is not None and not session.closed else None

    async def _models(self, request: web.Request) -> web.Response:
        if self._session_of(request) is None:
            return _error(401, UNAUTHORIZED, "invalid_request_error", "invalid_api_key")
        return web.json_response(models_body(self.model))

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, _chat_call)

    async def _responses(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, _responses_call)

    async def _serve(self, request: web.Request,
                     parse: Callable[[bytes, float], tuple[ChatRequest, Respond]]) -> web.StreamResponse:
        """One call of either API: authenticate, parse (``parse`` gives the chat call and how to answer it),
        ask the session in a worker thread, map failures to OpenAI errors."""
        t0 = time.perf_counter()
        session = self._session_of(request)
        if session is None:
            return _error(401, UNAUTHORIZED, "invalid_request_error", "invalid_api_key")
        llm_before = session.llm_s
        try:
            chat, respond = parse(await request.read(), session.sampling.temperature)
            answer = await asyncio.get_running_loop().run_in_executor(self._executor, session.chat, chat)
        except web.HTTPRequestEntityTooLarge:
            return _error(413, f"request body above {self.max_request_mb:g} MiB", "invalid_request_error")
        except WireError as exc:
            session.note_refusal(f"HTTP {exc.status} on {exc.param or 'the request'}: {exc}")
            return web.json_response(exc.body(), status=exc.status)
        except SessionClosed:
            return _error(401, UNAUTHORIZED, "invalid_request_error", "invalid_api_key")
        except BackendFailed as exc:
            return _error(502, exc.message, "server_error", "backend_failed")
        except Exception as exc:  # a bug in the gateway itself: infrastructure, recorded on the session
            log.exception("gateway call failed")
            session.note_error(repr(exc))
            return _error(500, f"gateway error: {exc!r}", "server_error")
        response = await respond(request, answer)
        session.add_gateway_time(time.perf_counter() - t0 - (session.llm_s - llm_before))
        return response


def _json(body: object) -> web.Response:
    return web.Response(body=json.dumps(body, ensure_ascii=False).encode(), content_type="application/json")


async def _event_stream(request: web.Request, payload: bytes) -> web.StreamResponse:
    stream = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await stream.prepare(request)
    await stream.write(payload)
    await stream.write_eof()
    return stream


def _chat_call(raw: bytes, temperature: float) -> tuple[ChatRequest, Respond]:
    chat = parse_request(raw, temperature)

    async def respond(request: web.Request, answer: ChatAnswer) -> web.StreamResponse:
        if not chat.stream:
            return _json(answer.body())
        return await _event_stream(request, sse(answer.chunks(chat.include_usage)))

    return chat, respond


def _responses_call(raw: bytes, temperature: float) -> tuple[ChatRequest, Respond]:
    call: ResponsesRequest = parse_responses(raw, temperature)

    async def respond(request: web.Request, answer: ChatAnswer) -> web.StreamResponse:
        out = ResponsesAnswer(call, answer)
        return await _event_stream(request, event_stream(out.events())) if call.chat.stream else _json(out.body())

    return call.chat, respond
