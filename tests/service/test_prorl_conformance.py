"""Conformance with NeMo Gym's ProRL integration (NVIDIA-NeMo/Gym ``responses_api_agents/prorl_agent``),
written only from the documented wire fields: plain HTTP (aiohttp client, http.client), no project
imports in the driving code. The server under test is the ``spoolrl rollout-server`` command (a real
bwrap sandbox per episode, the built-in SWE-bench-format instance, the real EVAL); the LLM is a
recording stand-in (:class:`tests.loopback_http.RecordingLLM`: its wire bodies written from the documented
fields, not with the project's wire code), which scripts a bash call then ``submit`` and records every
prompt it received and every token it produced.

Driven as that integration does: no Authorization header from a trusted address, ``/start`` accepting
400, ``/add_llm_server`` with the URL ``get_model_endpoint`` gives (NeMo Gym's own model server, a
STAND-IN here with its routes: ``/v1/chat/completions``, ``/v1/responses``, 404 elsewhere), refused with
a 422 that NeMo Gym only prints, so the episodes run on the backend the operator gave as
``service.llm_server`` (the documented config); later ``/add_llm_server`` of that backend itself; a group of 4 concurrent ``/process`` sharing ``job_id = instance_id`` with
only ``temperature``/``top_p``/``max_output_tokens``; then a second group cancelled mid-episode with
one ``/cancel``. Also: 401 from an untrusted source address (127.0.0.2) without the token.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from tokenizers import Tokenizer

from tests.loopback_http import RecordingLLM, serve_in_thread

pytestmark = pytest.mark.sandbox
ROOT = Path(__file__).resolve().parents[2]
GROUP = 4
BASH = '<tool_call>\n{"name": "bash", "arguments": {"command": "echo hi"}}\n</tool_call><|im_end|>'
SUBMIT = '<tool_call>\n{"name": "submit", "arguments": {}}\n</tool_call><|im_end|>'
SAMPLING = {"temperature": 0.9, "top_p": 1.0, "max_output_tokens": 48}  # what NeMo Gym forwards
CONFIG = ["trainer.precision=fp32", "slurm.train.gpus_per_node=0", "spool.poll_interval_s=0.1",
          "spool.heartbeat_interval_s=1", "spool.shard_max_trajectories=1", "rollout.metrics_interval_s=0.5",
          "rollout.run_workers=5", "rollout.init_workers=3", "rollout.eval_workers=2", "inference.max_retries=0",
          "rollout.max_retries=0", "rollout.max_turns=4"]


def recording_llm(tokenizer: Tokenizer) -> RecordingLLM:
    """The backend: first turn a bash call, then ``submit`` (once the bash call is in the prompt);
    logprob -0.25 - 0.001 * i for the i-th generated token."""
    bash = tokenizer.encode(BASH, add_special_tokens=False).ids
    submit = tokenizer.encode(SUBMIT, add_special_tokens=False).ids

    def reply(prompt: list[int], _call: int) -> list[int]:
        n = len(bash)
        return submit if any(prompt[i:i + n] == bash for i in range(len(prompt) - n + 1)) else bash

    return RecordingLLM(reply, logprob0=-0.25, max_model_len=4096)


def nemo_gym_model_server() -> str:
    """STAND-IN for NeMo Gym's model server (``responses_api_models/vllm_model``): the routes its
    ``SimpleResponsesAPIModel`` installs; FastAPI's ``{"detail": "Not Found"}`` 404 for any other path."""
    async def chat(_request: web.Request) -> web.Response:
        return web.json_response({"id": "chatcmpl", "object": "chat.completion", "choices": []})

    async def not_found(_request: web.Request) -> web.Response:
        return web.json_response({"detail": "Not Found"}, status=404)

    return serve_in_thread([web.post("/v1/chat/completions", chat), web.post("/v1/responses", chat),
                            web.route("*", "/{tail:.*}", not_found)])


def builtin_instance() -> dict[str, Any]:
    """A dataset row, as NeMo Gym's ``instance_dict`` holds it (read as data)."""
    row = json.loads((ROOT / "rollout_node/tasks/builtin/tasks.jsonl").read_text().splitlines()[0])
    return {**row, "data_source": "swe_gym"}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("prorl")
    model = tmp / "model"
    subprocess.run([sys.executable, "-m", "hpc.cli", "tiny-model", str(model)], check=True, capture_output=True)
    llm = recording_llm(Tokenizer.from_file(str(model / "tokenizer.json")))
    backend = llm.serve()
    log = open(tmp / "server.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen([sys.executable, "-m", "hpc.cli", "rollout-server", "--run", str(tmp / "run"),
                             "--host", "127.0.0.1", "--port", "0", "--trust-network", "127.0.0.1/32",
                             f"model.path={model}", f"sandbox.scratch_dir={tmp / 'scratch'}", *CONFIG,
                             f"service.llm_server={backend}/v1"],
                            stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, cwd=ROOT)
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline() or "null")
        assert ready, (tmp / "server.log").read_text()[-3000:]
        yield {"url": ready["url"], "token": ready["token"], "backend": backend, "llm": llm,
               "gym_model_server": nemo_gym_model_server()}
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


# ---------------------------------------------------------------------------- the client side
async def post(session: aiohttp.ClientSession, path: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    """As NeMo Gym posts: no Authorization header; ``/start`` without a body."""
    async with session.post(path, json=body) if body is not None else session.post(path) as resp:
        return resp.status, await resp.json()


async def get(session: aiohttp.ClientSession, path: str) -> dict[str, Any]:
    async with session.get(path) as resp:
        assert resp.status == 200
        return dict(await resp.json())


def from_untrusted(url: str, method: str, path: str, token: str | None = None) -> int:
    """Status of one request whose source address is 127.0.0.2 (outside --trust-network)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=30, source_address=("127.0.0.2", 0))
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"} if token else {})}
    conn.request(method, path, body=None if method == "GET" else b"{}", headers=headers)
    status = conn.getresponse().status
    conn.close()
    return status


def check_answer(res: dict[str, Any], job_id: str, llm: RecordingLLM) -> None:
    """Every field NeMo Gym reads, the prefix rule, and the IDs against the recording backend."""
    assert res["job_id"] == job_id and res["instance_id"] == job_id
    assert res["success"] is True and res["finish"] is True and res["end_properly"] is True
    assert res["filter"] is False and res["critical_error"] is None and res["error"] is None
    assert res["resolved"] is False and res["git_patch"] is None  # `echo hi` changed nothing
    names = {t["function"]["name"] for t in res["tools"] if t["type"] == "function"}
    assert {"bash", "submit"} <= names and all("parameters" in t["function"] for t in res["tools"])
    msgs = res["messages"]
    assert [m["role"] for m in msgs[:2]] == ["system", "user"]
    assistant = [m for m in msgs if m["role"] == "assistant"]
    assert len(assistant) == 2
    # tool calls flattened {"name", "arguments"}; tool messages answer them by id, numbered as NeMo Gym does
    calls = [tc for m in assistant for tc in m["tool_calls"]]
    assert [(c["name"], c["arguments"]) for c in calls] == [("bash", {"command": "echo hi"}), ("submit", {})]
    assert [c["id"] for c in calls] == ["call_1", "call_2"]
    assert [m["tool_call_id"] for m in msgs if m["role"] == "tool"] == ["call_1", "call_2"]
    seen = {(tuple(r["prompt"]), tuple(r["token_ids"])): r for r in llm.seen}
    for k, m in enumerate(assistant):
        assert len(m["logprobs"]) == len(m["token_ids"]) > 0 and m["input_ids"]
        record = seen[(tuple(m["input_ids"]), tuple(m["token_ids"]))]  # exactly what the backend saw and produced
        assert m["logprobs"] == pytest.approx(record["logprobs"], abs=1e-6)
        assert (record["temperature"], record["top_p"]) == (SAMPLING["temperature"], SAMPLING["top_p"])
        assert record["max_tokens"] == SAMPLING["max_output_tokens"]  # per generation, as NeMo Gym means it
        if k:
            before = assistant[k - 1]["input_ids"] + assistant[k - 1]["token_ids"]
            assert m["input_ids"][: len(before)] == before  # turn k extends turn k-1 token for token


async def drive(srv: dict[str, Any]) -> None:
    instance, llm = builtin_instance(), srv["llm"]
    job_id = instance["instance_id"]
    async with aiohttp.ClientSession(srv["url"], timeout=aiohttp.ClientTimeout(total=300)) as s:
        assert (await post(s, "/start"))[0] in (200, 400)
        assert (await post(s, "/start"))[0] == 400  # "already running" is what NeMo Gym tolerates
        code, body = await post(s, "/add_llm_server", {"address": srv["gym_model_server"] + "/v1"})
        assert code == 422 and "/v1/completions" in body["detail"], body  # initialize_prorl_server only prints it
        assert (await get(s, "/status"))["llm_servers"] == [srv["backend"]]  # service.llm_server serves
        code, body = await post(s, "/process", {"instance": instance, "sampling_params": {"temperature": 0.0},
                                                "job_id": job_id})
        assert code == 400 and "temperature" in body["detail"]  # greedy cannot be trained: refused, clearly

        group = [post(s, "/process", {"instance": instance, "sampling_params": SAMPLING, "job_id": job_id})
                 for _ in range(GROUP)]
        plain = post(s, "/process", {"instance": instance, "job_id": "plain",
                                     "sampling_params": {**SAMPLING, "token_level_generation": False}})
        *answers, (code, bare) = await asyncio.gather(*group, plain)
        assert [c for c, _ in answers] == [200] * GROUP, answers
        assert len({a["trajectory_id"] for _, a in answers}) == GROUP
        for _, res in answers:
            check_answer(res, job_id, llm)
        assert code == 200 and bare["success"] is True
        assert not {"token_ids", "logprobs", "input_ids"} & {k for m in bare["messages"] for k in m}
        assert [m["tool_calls"][0]["name"] for m in bare["messages"] if m["role"] == "assistant"] == ["bash", "submit"]

        code, body = await post(s, "/add_llm_server", {"address": srv["backend"] + "/v1"})
        assert code == 200 and body["status"] == f"Added LLM server {srv['backend']}", body

        llm.hold.set()  # the second group parks at its first LLM call: mid-episode, sandboxes open
        held = [asyncio.ensure_future(post(s, "/process", {"instance": instance, "sampling_params": SAMPLING,
                                                            "job_id": "group-2"})) for _ in range(GROUP)]
        deadline = time.monotonic() + 120
        while llm.held < GROUP:
            assert time.monotonic() < deadline, f"only {llm.held} of {GROUP} episodes reached the LLM"
            await asyncio.sleep(0.1)
        status = await get(s, "/status")
        assert (status["in_flight"], status["job_ids_in_flight"]) == (GROUP, 1)
        code, body = await post(s, "/cancel", {"job_id": "group-2"})
        assert code == 200 and body["cancelled"] == GROUP
        for code, res in await asyncio.gather(*held):
            assert code == 200 and res["status"] == "cancelled" and res["success"] is False and res["filter"] is True
        llm.hold.clear()
        assert (await get(s, "/status"))["in_flight"] == 0
        assert (await post(s, "/cancel", {"job_id": "group-2"}))[0] == 404


def test_nemo_gym_prorl_client(server: dict[str, Any]) -> None:
    asyncio.run(drive(server))


def test_untrusted_address_needs_the_token(server: dict[str, Any]) -> None:
    for method, path in (("GET", "/status"), ("POST", "/process"), ("POST", "/start"), ("POST", "/cancel")):
        assert from_untrusted(server["url"], method, path) == 401, path
        assert from_untrusted(server["url"], method, path, token="wrong") == 401, path
    assert from_untrusted(server["url"], "POST", "/cancel", token=server["token"]) == 400  # in: a bad body
