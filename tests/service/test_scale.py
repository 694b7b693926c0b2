"""The service under load and across nodes.

- 200 simultaneous ``/process`` calls through the real aiohttp app, front door and spool, served by
  two in-process service nodes (the real pipeline with cheap task ops, tests/service/helpers.py)
  against a recording stand-in backend: every call is answered once with its own job, the work
  lands on both nodes, far fewer threads than requests exist, and the token IDs in every answer
  are exactly those the backend produced and received.
- A node killed (SIGKILL) mid-episode: its lease expires, another node process reclaims the task,
  and the answer reports the rerun (``attempt`` 1, ``previous_nodes`` naming the dead node).
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from hpc.config import load_config
from hpc.config.service import ServiceSection
from hpc.rundir import create_run
from hpc.spool import Spool
from rollout_node.pipeline.node import NodeOptions
from rollout_node.pipeline.sizing import Workers
from rollout_node.service.app import Service
from rollout_node.service.backends import Backends
from rollout_node.service.frontdoor import FrontDoor
from rollout_node.service.node import ServiceNode, make_service_policy
from tests.service.helpers import DIFF, NullOps, start_standin
from tests.service.wire_client import http

ROOT = Path(__file__).resolve().parents[2]
N = 200
BASE = ["trainer.precision=fp32", "slurm.train.gpus_per_node=0", "spool.poll_interval_s=0.1",
        "spool.shard_max_trajectories=1", "rollout.metrics_interval_s=1"]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tok") / "model"
    subprocess.run([sys.executable, "-m", "hpc.cli", "tiny-model", str(out)], check=True, capture_output=True)
    return out


def _instance(i: int) -> dict[str, Any]:
    return {"data_source": "swe_gym", "instance_id": f"inst-{i}", "repo": "o/r", "base_commit": "0" * 40,
            "patch": "x", "test_patch": "y", "FAIL_TO_PASS": [], "PASS_TO_PASS": [],
            "problem_statement": f"fix bug number {i}"}


async def _fire(url: str, token: str) -> list[tuple[int, dict[str, Any]]]:
    headers = {"Authorization": f"Bearer {token}"}
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(url, headers=headers, connector=conn) as session:
        async def one(i: int) -> tuple[int, dict[str, Any]]:
            body = {"instance": _instance(i), "job_id": f"job-{i}", "sampling_params": {"token_level_generation": True}}
            async with session.post("/process", json=body) as resp:
                return resp.status, await resp.json()
        return list(await asyncio.gather(*(one(i) for i in range(N))))


async def _serve_and_fire(paths: Any, cfg: Any, backend: str, token: str) -> tuple[list[Any], int]:
    from aiohttp import web

    svc = Service(FrontDoor(paths, cfg, timeout_s=120, poll_s=0.05), Backends(paths.endpoints),
                  ServiceSection(max_pending=N), token)
    runner = web.AppRunner(svc.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        async with aiohttp.ClientSession(url, headers={"Authorization": f"Bearer {token}"}) as s:
            await s.post("/start")
            await s.post("/add_llm_server", json={"address": backend + "/v1"})
        await asyncio.sleep(0.5)
        base = threading.active_count()  # node workers, spool I/O thread, this loop
        fire = asyncio.create_task(_fire(url, token))
        peak = 0
        while not fire.done():
            peak = max(peak, threading.active_count())
            await asyncio.sleep(0.05)
        return await asyncio.wait_for(fire, 180), peak - base
    finally:
        await runner.cleanup()


def test_200_simultaneous_process_calls_token_exact(tmp_path: Path, model: Path) -> None:
    cfg = load_config(None, [*BASE, f"model.path={model}", f"sandbox.scratch_dir={tmp_path / 'scratch'}"])
    paths = create_run(tmp_path / "run", cfg)
    record = tmp_path / "record.jsonl"
    standin, backend = start_standin(model, tmp_path, "--latency-s", "0.05", "--record", str(record))
    nodes = [ServiceNode(paths, cfg, Spool(paths.root, cfg.spool), NullOps(),  # type: ignore[arg-type]  # NullOps: a partial stand-in
                         make_service_policy(paths, cfg),
                         NodeOptions(node_id=f"n{i}", workers=Workers(4, 32, 4), scratch=tmp_path / f"node{i}"))
             for i in range(2)]
    threads = [threading.Thread(target=n.run, daemon=True) for n in nodes]
    for t in threads:
        t.start()
    try:
        results, extra_threads = asyncio.run(_serve_and_fire(paths, cfg, backend, paths.secret.read_text().strip()))
    finally:
        for n in nodes:
            n.request_drain("test over")
        for t in threads:
            t.join(30)
        standin.kill()
    assert [code for code, _ in results] == [200] * N
    assert sorted(r["job_id"] for _, r in results) == sorted(f"job-{i}" for i in range(N))
    assert all(r["status"] == "ok" and r["resolved"] and r["git_patch"] == DIFF for _, r in results)
    assert {r["node"].split(".")[0] for _, r in results} == {"n0", "n1"}  # one URL, work on both nodes
    # a thread per blocked /process would add >= 200; what is added is executors (DNS, spool I/O)
    assert extra_threads < N // 4, extra_threads
    probe, *episodes = (json.loads(line) for line in record.read_text().splitlines())
    assert probe["prompt"] == [0] and len(probe["token_ids"]) == 1  # /add_llm_server's probe came first
    produced = {tuple(r["prompt"]): r["token_ids"] for r in episodes}
    assert len(produced) == N  # distinct problems -> distinct prompts, one completion each
    for _, r in results:
        (turn,) = [m for m in r["messages"] if m["role"] == "assistant"]
        prompt = tuple(r["token_ids"][: turn["prompt_len"]])
        assert produced[prompt] == turn["token_ids"]  # what the backend received and produced, exactly
        assert r["token_ids"][turn["prompt_len"]: turn["prompt_len"] + len(turn["token_ids"])] == turn["token_ids"]


def _node(run: Path, name: str, tmp: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "hpc.cli", "rollout-server", "--node-only", "--run", str(run)],
                            stdout=open(tmp / f"{name}.log", "wb"), stderr=subprocess.STDOUT, cwd=ROOT)


def _builtin() -> dict[str, Any]:
    rows = [json.loads(line) for line in (ROOT / "rollout_node/tasks/builtin/tasks.jsonl").read_text().splitlines()]
    return {**rows[0], "data_source": "swe_bench"}


@pytest.mark.sandbox
def test_node_killed_mid_episode_is_rerun_elsewhere_and_reported(tmp_path: Path, model: Path) -> None:
    standin, backend = start_standin(model, tmp_path, "--latency-s", "1.0", "--reply", "thinking")
    run = tmp_path / "run"
    server = subprocess.Popen([sys.executable, "-m", "hpc.cli", "rollout-server", "--run", str(run), "--port", "0",
                               *BASE, f"model.path={model}", f"sandbox.scratch_dir={tmp_path / 'scratch'}",
                               "spool.lease_s=4", "spool.heartbeat_interval_s=1",
                               "service.local_nodes=0", "service.timeout_s=120"],
                              stdout=subprocess.PIPE, stderr=open(tmp_path / "server.log", "wb"), cwd=ROOT)
    procs = [server, standin]
    try:
        assert server.stdout is not None
        ready = json.loads(server.stdout.readline() or "null")
        assert ready, (tmp_path / "server.log").read_text()[-3000:]
        url, token = ready["url"], ready["token"]
        assert http(url, "/start", {}, token=token)[0] == 200
        assert http(url, "/add_llm_server", {"address": backend}, token=token)[0] == 200
        first = _node(run, "a", tmp_path)
        procs.append(first)
        out: dict[str, Any] = {}
        body = {"instance": _builtin(), "sampling_params": {"max_iterations": 8}, "job_id": "survivor"}
        caller = threading.Thread(target=lambda: out.update(r=http(url, "/process", body, token=token)))
        caller.start()
        deadline = time.monotonic() + 120
        while http(url, "/status", token=token)[1].get("active_run", 0) < 1:
            assert time.monotonic() < deadline and first.poll() is None, (tmp_path / "a.log").read_text()[-2000:]
            time.sleep(0.2)
        first.send_signal(signal.SIGKILL)
        first.wait()
        procs.append(_node(run, "b", tmp_path))
        caller.join(120)
        code, res, _ = out["r"]
        assert code == 200 and res["job_id"] == "survivor", res
        assert res["attempt"] == 1 and len(res["previous_nodes"]) == 1 and res["node"] != res["previous_nodes"][0]
        assert res["status"] == "truncated"  # 8 turns of a reply that never calls a tool
        assert http(url, "/status", token=token)[1]["total_rerun_after_lost_lease"] == 1
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
