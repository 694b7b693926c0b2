"""Rollout-as-a-Service benchmark: episodes per minute through ``spoolrl rollout-server`` at 1/2/4
rollout-node processes, and the API's cost per episode against the same episodes run by
``spoolrl rollout-node`` straight from the spool, side by side in one run.

    .venv/bin/python scripts/bench_raas.py [--episodes 24] [--latency-s 0.2] [--nodes 1 2 4]

Each episode is a built-in SWE-bench-format instance in a real bwrap sandbox with the real EVAL;
the LLM is the stand-in backend (rollout_node/service/standin.py: a fixed latency per completion,
replying ``submit``), so what is measured is the rollout machinery and the API, not a model.
Prints one JSON line per configuration and a Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ["trainer.precision=fp32", "slurm.train.gpus_per_node=0", "spool.poll_interval_s=0.1",
          "spool.shard_max_trajectories=1", "rollout.metrics_interval_s=1"]


def cli(*args: str, **kw: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-m", "hpc.cli", *args], cwd=ROOT, stdin=subprocess.DEVNULL, **kw)


def wait_for(path: Path, limit_s: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + limit_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"{path} did not appear")
        time.sleep(0.05)
    return dict(json.loads(path.read_text()))


def instances(n: int) -> list[dict[str, Any]]:
    rows = [json.loads(x) for x in (ROOT / "rollout_node/tasks/builtin/tasks.jsonl").read_text().splitlines()]
    return [{**rows[i % len(rows)], "data_source": "swe_bench"} for i in range(n)]


async def fire(url: str, token: str, todo: list[dict[str, Any]]) -> list[dict[str, Any]]:
    async with aiohttp.ClientSession(url, headers={"Authorization": f"Bearer {token}"},
                                     timeout=aiohttp.ClientTimeout(total=3600)) as s:
        async def one(i: int, inst: dict[str, Any]) -> dict[str, Any]:
            async with s.post("/process", json={"instance": inst, "job_id": f"b{i}"}) as r:
                body = await r.json()
                if r.status != 200:
                    raise SystemExit(f"/process answered {r.status}: {body}")
                return dict(body)
        return list(await asyncio.gather(*(one(i, x) for i, x in enumerate(todo))))


async def post(url: str, token: str, path: str, body: dict[str, Any]) -> None:
    async with aiohttp.ClientSession(url, headers={"Authorization": f"Bearer {token}"}) as s:
        async with s.post(path, json=body) as r:
            assert r.status == 200, (path, r.status, await r.text())


def through_api(tmp: Path, model: Path, backend: str, nodes: int, episodes: int) -> dict[str, Any]:
    run = tmp / f"api-{nodes}"
    server = cli("rollout-server", "--run", str(run), "--port", "0", *CONFIG, f"model.path={model}",
                 f"sandbox.scratch_dir={tmp / 'scratch'}", "service.local_nodes=0",
                 stdout=subprocess.PIPE, stderr=open(tmp / f"server-{nodes}.log", "wb"))
    assert server.stdout is not None
    ready = json.loads(server.stdout.readline())
    workers = [cli("rollout-server", "--node-only", "--run", str(run), stdout=open(tmp / f"node-{nodes}-{i}.log", "wb"),
                   stderr=subprocess.STDOUT) for i in range(nodes)]
    try:
        url, token = ready["url"], ready["token"]
        asyncio.run(post(url, token, "/start", {}))
        asyncio.run(post(url, token, "/add_llm_server", {"address": backend + "/v1"}))
        asyncio.run(fire(url, token, instances(max(2, nodes))))  # warm-up: node start-up, image, repos
        t0 = time.perf_counter()
        results = asyncio.run(fire(url, token, instances(episodes)))
        wall = time.perf_counter() - t0
    finally:
        for p in [server, *workers]:
            p.terminate()
        for p in [server, *workers]:
            p.wait(60)
    ok = sum(r["status"] in ("ok", "truncated") for r in results)
    others = sorted(r["timing"]["others"] for r in results)
    return {"mode": "api", "nodes": nodes, "episodes": episodes, "ok": ok, "wall_s": round(wall, 2),
            "episodes_per_min": round(60 * episodes / wall, 1), "others_s_median": round(others[len(others) // 2], 3),
            "nodes_used": len({r["node"] for r in results})}


def by_rollout_node(tmp: Path, model: Path, backend: str, episodes: int) -> dict[str, Any]:
    from hpc.config import load_config
    from hpc.records import EndpointRecord, write_endpoint
    from hpc.rundir import create_run
    from hpc.spool import Spool

    cfg = load_config(None, [*CONFIG, f"model.path={model}", f"sandbox.scratch_dir={tmp / 'scratch'}"])
    paths = create_run(tmp / "node-run", cfg)
    write_endpoint(paths.endpoints / "infer-standin.json", EndpointRecord(role="infer", url=backend, heartbeat=1))
    spool = Spool(paths.root, cfg.spool)
    warm = 2
    spool.put_tasks([{"task_id": f"w{i}", "group_size": 1, "instance": x} for i, x in enumerate(instances(warm))])
    node = cli("rollout-node", str(paths.root), "--max-episodes", str(warm + episodes),
               stdout=subprocess.DEVNULL, stderr=open(tmp / "rollout-node.log", "wb"))
    while spool.stats().get("tasks_done", 0) < warm:  # warm-up done: same state as the API's nodes
        time.sleep(0.05)
    t0 = time.perf_counter()
    spool.put_tasks([{"task_id": f"t{i}", "group_size": 1, "instance": x} for i, x in enumerate(instances(episodes))])
    while spool.stats().get("tasks_done", 0) < warm + episodes:
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    node.wait(120)
    return {"mode": "rollout-node", "nodes": 1, "episodes": episodes, "wall_s": round(wall, 2),
            "episodes_per_min": round(60 * episodes / wall, 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=24)
    p.add_argument("--latency-s", type=float, default=0.2, help="stand-in LLM latency per completion")
    p.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 4])
    args = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-raas-"))
    model = tmp / "model"
    subprocess.run([sys.executable, "-m", "hpc.cli", "tiny-model", str(model)], check=True, capture_output=True, cwd=ROOT)
    standin = subprocess.Popen([sys.executable, "-m", "rollout_node.service.standin", "--tokenizer", str(model),
                                "--latency-s", str(args.latency_s), "--ready-file", str(tmp / "standin.json")],
                               cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        backend = str(wait_for(tmp / "standin.json")["url"])
        rows = [by_rollout_node(tmp, model, backend, args.episodes)]
        rows += [through_api(tmp, model, backend, n, args.episodes) for n in args.nodes]
    finally:
        standin.kill()
    for row in rows:
        print(json.dumps(row))
    base = rows[0]["wall_s"] / args.episodes
    print("\n| path | rollout-node processes | episodes | wall s | episodes/min | overhead/episode vs rollout-node |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        same = r["mode"] == "api" and r["nodes"] == 1  # the like-for-like pair
        extra = f"{(r['wall_s'] / args.episodes - base) * 1000:+.0f} ms" if same else "-"
        print(f"| {r['mode']} | {r['nodes']} | {r['episodes']} | {r['wall_s']} | {r['episodes_per_min']} | {extra} |")


if __name__ == "__main__":
    main()
