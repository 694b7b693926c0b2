"""The HTTP face (aiohttp): ProRL-Agent-Server's endpoints over :class:`FrontDoor`.

Guarantees:
- Every endpoint requires ``Authorization: Bearer <run secret>`` (constant-time compare; 401
  otherwise), except from a source address inside ``trust_network`` (``--trust-network``), and
  unless the server was started with ``--no-auth``.
- Bodies are JSON objects of at most ``max_request_mb`` (413 above it, 400 when not JSON).
- ``/process`` is admitted only while running (503), with a backend (503), below ``max_pending``
  jobs in flight (503 + ``Retry-After``); it then awaits its job's future: no thread per call.
  Calls sharing a ``job_id`` are one group: all run, each answers; ``/cancel`` ends them all.
- ``/add_llm_server`` registers an address only after one token-ID completion through the nodes' own
  client (:mod:`rollout_node.service.probe`): an address that answers but cannot serve the nodes
  (NeMo Gym's model server, an OpenAI server without token IDs) is a 422 naming what is missing and
  what to register instead; one that does not answer yet is registered, and the answer says so.
  ``service.llm_server`` backends are registered at startup (not probed: the engine may start later).
- ``/stop`` ends every job (``server is stopping; job cancelled``), tells the nodes to stop them
  (their sandboxes are closed) and withdraws the backends.
- Shutting down (SIGTERM/SIGINT) ends every job at once with 503 (``server is shutting down; job
  cancelled``) and tells the nodes to stop them, before aiohttp waits for the handlers still
  running: a call in flight never holds the server past a time limit's grace.
"""

from __future__ import annotations

import asyncio
import hmac
import ipaddress
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from hpc.config.service import Network, ServiceSection, trusted_networks
from rollout_node.service import wire
from rollout_node.service.backends import Backends, base_url
from rollout_node.service.frontdoor import SHUTTING_DOWN, FrontDoor, JobEnded
from rollout_node.service.probe import probe_backend, refusal_detail

log = logging.getLogger("spoolrl.service")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
HEARTBEAT_S = 5.0


def _json(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response(body, status=status, headers=headers)


def _detail(status: int, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return _json(status, {"detail": message}, headers)


def trusted(remote: str | None, networks: tuple[Network, ...]) -> bool:
    """Whether a peer address lies in one of ``networks`` (a Unix socket or unknown peer never does)."""
    try:
        address = ipaddress.ip_address(remote or "")
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # a dual-stack listener sees IPv4 clients as ::ffff:a.b.c.d
    return any(address in net for net in networks)


class Service:
    """Routes bound to one front door, one backend registry and one token."""

    def __init__(self, door: FrontDoor, backends: Backends, cfg: ServiceSection, token: str) -> None:
        self.door, self.backends, self.cfg, self.token = door, backends, cfg, token
        self.trusted = trusted_networks(cfg.trust_network)
        for address in cfg.llm_servers():
            backends.add(address)
        self._beat: asyncio.Task[None] | None = None

    def app(self) -> web.Application:
        app = web.Application(client_max_size=int(self.cfg.max_request_mb * 2**20),
                              middlewares=[self._errors, self._auth])
        app.add_routes([web.post("/start", self.start), web.post("/stop", self.stop), web.get("/status", self.status),
                        web.post("/add_llm_server", self.add_llm_server),
                        web.post("/clear_llm_server", self.clear_llm_server),
                        web.post("/process", self.process), web.post("/cancel", self.cancel)])
        app.on_startup.append(self._on_startup)
        app.on_shutdown.append(self._on_shutdown)
        app.on_cleanup.append(self._on_cleanup)
        return app

    async def _on_startup(self, _app: web.Application) -> None:
        await self.door.open()
        self._beat = asyncio.create_task(self._heartbeat())

    async def _on_shutdown(self, _app: web.Application) -> None:
        # aiohttp runs this before it waits (up to 60 s) for the handlers still running: a /process call
        # waiting on its job would otherwise hold the server past a time limit's grace (SIGKILL, its
        # claim left to a lease). Its job ends now with 503, and the nodes are told to stop it.
        self.door.running = False
        self.door.fail_all(503, SHUTTING_DOWN)

    async def _on_cleanup(self, _app: web.Application) -> None:
        if self._beat is not None:
            self._beat.cancel()
        self.backends.withdraw()
        await self.door.close()

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            self.backends.heartbeat()

    # ------------------------------------------------------------------ middlewares
    @web.middleware
    async def _auth(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.cfg.auth and not trusted(request.remote, self.trusted):
            given = request.headers.get("Authorization", "")
            if not hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
                return _detail(401, "missing or wrong bearer token (the run secret: RUN/control/secret)")
        return await handler(request)

    @web.middleware
    async def _errors(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except wire.WireError as exc:
            return _detail(exc.status, str(exc))
        except web.HTTPRequestEntityTooLarge:
            return _detail(413, f"request body over {self.cfg.max_request_mb:g} MB")

    async def _body(self, request: web.Request) -> dict[str, Any]:
        if not request.can_read_body:
            return {}
        try:
            data = json.loads(await request.read())
        except ValueError as exc:
            raise wire.WireError(400, f"body is not JSON: {exc}") from exc
        if not isinstance(data, dict):
            raise wire.WireError(400, "body must be a JSON object")
        return data

    # ------------------------------------------------------------------ control endpoints
    async def start(self, _request: web.Request) -> web.Response:
        if self.door.running:
            return _detail(400, "already running")
        self.door.running = True
        self.backends.announce()
        self.door.backends_changed()
        return _json(200, {"status": "started"})

    async def stop(self, _request: web.Request) -> web.Response:
        if not self.door.running:
            return _detail(503, "not running")
        self.door.running = False
        self.backends.withdraw()
        n = self.door.fail_all(503, "server is stopping; job cancelled")
        return _json(200, {"status": f"stopped; {n} job(s) cancelled"})

    async def status(self, _request: web.Request) -> web.Response:
        if not self.door.running:
            return _detail(503, "not running")
        counts = await asyncio.get_running_loop().run_in_executor(None, self.door.stage_counts)
        return _json(200, {"status": "running", "pending_jobs": self.door.pending(), **counts,
                           "in_flight": len(self.door.jobs), "job_ids_in_flight": len(self.door.by_job_id),
                           "llm_servers": list(self.backends.urls),
                           **{f"total_{k}": v for k, v in sorted(self.door.counts.items())}})

    async def add_llm_server(self, request: web.Request) -> web.Response:
        address = (await self._body(request)).get("address")
        if not isinstance(address, str):
            raise wire.WireError(400, "address must be a string such as http://host:8000/v1")
        url = base_url(address)
        probe = await asyncio.get_running_loop().run_in_executor(
            None, lambda: probe_backend(url, token=self.token, timeout_s=self.cfg.probe_timeout_s))
        if probe.refusal is not None:
            log.warning("/add_llm_server %s refused: %s", address, probe.refusal)
            return _detail(422, refusal_detail(address, probe.refusal))
        self.backends.add(address)
        self.door.backends_changed()
        word = "Added" if self.door.running else "Buffered"
        if probe.unverified is None:
            return _json(200, {"status": f"{word} LLM server {url}"})
        log.warning("/add_llm_server %s registered unverified: %s", address, probe.unverified)
        return _json(200, {"status": f"{word} LLM server {url} (not answering yet: {probe.unverified})"})

    async def clear_llm_server(self, _request: web.Request) -> web.Response:
        n = self.backends.clear()
        self.door.backends_changed()
        return _json(200, {"status": f"Cleared {n} LLM server(s)"})

    async def cancel(self, request: web.Request) -> web.Response:
        job_id = (await self._body(request)).get("job_id")
        if not isinstance(job_id, str):
            raise wire.WireError(400, "job_id must be a string")
        n = self.door.cancel(job_id, f"job {job_id} cancelled by /cancel")
        if not n:
            return _detail(404, f"no job {job_id!r} in flight")
        return _json(200, {"status": f"Cancel requested for job {job_id}", "cancelled": n})

    # ------------------------------------------------------------------ /process
    async def process(self, request: web.Request) -> web.Response:
        body = await self._body(request)
        instance, _handler = wire.check_instance(body.get("instance"))
        sampling = wire.check_sampling(body.get("sampling_params"), self.cfg.token_level)
        job_id = wire.check_job_id(body.get("job_id"), str(uuid.uuid4()))
        if not self.door.running:
            return _detail(503, "not running: POST /start first")
        if not self.backends.urls:
            return _detail(503, "no LLM server: POST /add_llm_server first")
        if len(self.door.jobs) >= self.cfg.max_pending:
            return _detail(503, f"{len(self.door.jobs)} jobs in flight (max_pending); retry later",
                           {"Retry-After": str(self.cfg.retry_after_s)})
        job = self.door.submit(job_id, instance, sampling)
        try:
            return _json(200, await job.future)
        except JobEnded as ended:
            return _json(ended.status, ended.body) if ended.body is not None else _detail(ended.status, str(ended))
        except asyncio.CancelledError:  # the client went away: stop the episode, free its sandbox
            self.door.disconnected(job)
            raise
