"""``/add_llm_server`` probes the address with the nodes' own request before registering it.

Real aiohttp servers on loopback, driven as NeMo Gym's ``initialize_prorl_server`` does (no token from
a trusted address, ``/start`` then ``/add_llm_server {"address"}``):
- a STAND-IN for NeMo Gym's model server (``responses_api_models/vllm_model``: the routes
  ``SimpleResponsesAPIModel.setup_webserver`` installs, ``GET /`` liveness, FastAPI's 404 body for every
  other path), registered as ``get_model_endpoint`` gives it (``http://host:port/v1``): 422 naming what
  is missing and what to register instead; the backend from ``service.llm_server`` stays the only one;
- an OpenAI-style ``/v1/completions`` without token IDs: 422;
- an address nobody listens on: registered, flagged as not answering yet (an engine may start later);
- the token-ID stand-in (rollout_node.service.standin): registered after one real probe completion.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from hpc.config import load_config
from hpc.config.service import ServiceSection
from hpc.errors import ConfigError
from hpc.rundir import create_run
from rollout_node.service.app import Service
from rollout_node.service.backends import Backends
from rollout_node.service.frontdoor import FrontDoor
from rollout_node.service.standin import StandIn
from tests.service.test_service_cli import _settings

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def nemo_gym_model_server() -> web.Application:
    """STAND-IN for NeMo Gym's vllm_model server (NVIDIA-NeMo/Gym ``nemo_gym/base_responses_api_model.py``,
    ``server_utils.py``): POST /v1/chat/completions, /v1/responses, /v1/messages and GET / only; FastAPI
    answers every other path 404 ``{"detail": "Not Found"}``. Its answers here are minimal: the probe
    must be refused before it would ever generate."""
    async def chat(_request: web.Request) -> web.Response:
        return web.json_response({"id": "chatcmpl", "object": "chat.completion", "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}]})

    async def responses(_request: web.Request) -> web.Response:
        return web.json_response({"id": "resp", "object": "response", "output": []})

    async def liveness(_request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    @web.middleware
    async def fastapi_404(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPNotFound:
            return web.json_response({"detail": "Not Found"}, status=404)

    app = web.Application(middlewares=[fastapi_404])
    app.add_routes([web.post("/v1/chat/completions", chat), web.post("/v1/responses", responses),
                    web.post("/v1/messages", responses), web.get("/", liveness)])
    return app


def text_only_server() -> web.Application:
    """An OpenAI-style completions server that answers text, no token IDs."""
    async def models(_request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "text-model"}]})

    async def complete(_request: web.Request) -> web.Response:
        return web.json_response({"choices": [{"index": 0, "text": "!", "finish_reason": "length",
                                               "logprobs": None}]})

    app = web.Application()
    app.add_routes([web.get("/v1/models", models), web.post("/v1/completions", complete)])
    return app


@asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


def closed_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}"


async def post(session: aiohttp.ClientSession, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    """As NeMo Gym's initialize_prorl_server posts: no Authorization header."""
    async with session.post(path, json=body) if body is not None else session.post(path) as resp:
        return resp.status, await resp.json()


def announced(run: Path) -> set[str]:
    """The backends the rollout nodes read (RUN/endpoints/infer-raas-*.json)."""
    return {json.loads(p.read_text())["url"] for p in (run / "endpoints").glob("infer-raas-*.json")}


async def drive(tmp: Path) -> None:
    cfg = load_config(None, ["trainer.precision=fp32", "slurm.train.gpus_per_node=0",
                             f"sandbox.scratch_dir={tmp / 'scratch'}"])
    paths = create_run(tmp / "run", cfg)
    standin = StandIn([7, 8, 9], 0.0, None, 4096)
    async with serving(standin.app()) as vllm, serving(nemo_gym_model_server()) as gym, \
            serving(text_only_server()) as text:
        svc_cfg = ServiceSection(trust_network="127.0.0.1/32", llm_server=f"{vllm}/v1", probe_timeout_s=5)
        svc = Service(FrontDoor(paths, cfg, timeout_s=60, poll_s=0.05), Backends(paths.endpoints), svc_cfg,
                      paths.secret.read_text().strip())
        async with serving(svc.app()) as url, aiohttp.ClientSession(url) as s:
            assert (await post(s, "/start"))[0] == 200
            assert announced(paths.root) == {vllm}  # service.llm_server: there before anyone registers

            code, body = await post(s, "/add_llm_server", {"address": f"{gym}/v1"})  # get_model_endpoint's URL
            assert code == 422, body
            for words in ("/v1/models: HTTP 404", "/v1/completions with a token-ID prompt", "vllm_model",
                          "policy_base_url", "service.llm_server", "Nothing was registered"):
                assert words in body["detail"], (words, body)
            async with s.get("/status") as resp:
                assert (await resp.json())["llm_servers"] == [vllm]
            assert announced(paths.root) == {vllm}  # NeMo Gym only warns on the 422: the server still works

            code, body = await post(s, "/add_llm_server", {"address": f"{text}/v1"})
            assert code == 422 and "not token level" in body["detail"] and "token_ids" in body["detail"], body

            dead = closed_port()
            code, body = await post(s, "/add_llm_server", {"address": f"{dead}/v1"})
            assert code == 200 and body["status"].startswith(f"Added LLM server {dead} (not answering yet"), body
            assert announced(paths.root) == {vllm, dead}

            assert (await post(s, "/clear_llm_server", {}))[1]["status"] == "Cleared 2 LLM server(s)"
            assert announced(paths.root) == set()
            before = standin.completions
            code, body = await post(s, "/add_llm_server", {"address": f"{vllm}/v1"})
            assert (code, body) == (200, {"status": f"Added LLM server {vllm}"})
            assert standin.completions == before + 1  # one real token-ID completion was the probe
            assert announced(paths.root) == {vllm}


def test_add_llm_server_probes_the_address(tmp_path: Path) -> None:
    asyncio.run(asyncio.wait_for(drive(tmp_path), 120))


def test_llm_server_setting_is_checked_before_anything_starts() -> None:
    cfg = _settings(["service.llm_server=http://a:8000/v1, http://b:8000"])
    assert cfg.llm_servers() == ["http://a:8000/v1", "http://b:8000"]
    with pytest.raises(ConfigError, match=r"service.llm_server: address 'vllm-host:8000' must be an http"):
        _settings(["service.llm_server=http://a:8000/v1,vllm-host:8000"])
    for bad in ("soon", "0"):
        with pytest.raises(ConfigError, match="service.probe_timeout_s"):
            _settings([f"service.probe_timeout_s={bad}"])
