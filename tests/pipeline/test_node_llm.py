"""The rollout node with the LLM agent (``rollout.policy: llm``): a real ``spoolrl serve`` CPU engine
with a tiny random model announced in RUN/endpoints, real sandboxes and the real EVAL harness.

A random model writes no useful tool call, so rewards are 0; what is checked is the plumbing:
token records come from the server (versions from its spans), groups are written, and with no
server the inference-error row of the fault table holds on the real client.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from hpc.config import load_config
from hpc.paths import RunPaths
from hpc.rundir import create_run
from hpc.spool import Spool
from hpc.trajectory import Status
from rollout_node.agent import SYSTEM_PROMPTS, ChatTemplate
from rollout_node.pipeline.bindings import RealTaskOps
from rollout_node.pipeline.llm import LLMPolicy
from rollout_node.pipeline.node import NodeOptions, RolloutNode
from rollout_node.pipeline.sizing import Workers
from rollout_node.sandbox import bwrap_unavailable_reason
from tests.pipeline.readback import written

pytestmark = pytest.mark.sandbox
VERSION = 3
CONFIG = ["trainer.precision=fp32", "slurm.train.gpus_per_node=0", "spool.poll_interval_s=0.1",
          "spool.heartbeat_interval_s=1", "spool.shard_max_age_s=1", "rollout.policy=llm", "rollout.max_turns=3",
          "rollout.max_new_tokens_per_turn=12", "rollout.max_retries=1", "rollout.metrics_interval_s=1",
          "algorithm.group_size=2", "inference.max_retries=0"]
IDS = ["spoolrl__intervals-1", "spoolrl__textkit-1"]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if why := bwrap_unavailable_reason():
        pytest.skip(why)
    from train_node.infer.tiny import build_tiny_model

    return Path(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0))


def make_run(tmp_path: Path, model: Path, *extra: str) -> tuple[RunPaths, Any]:
    cfg = load_config(None, [*CONFIG, f"model.path={model}", f"sandbox.scratch_dir={tmp_path / 'scratch'}", *extra])
    paths = create_run(tmp_path / "run", cfg)
    Spool(paths.root, cfg.spool).put_tasks([{"task_id": i, "instance_id": i, "group_size": 2} for i in IDS])
    return paths, cfg


def run_node(paths: RunPaths, cfg: Any, tmp_path: Path) -> dict[str, Any]:
    policy = LLMPolicy(paths, cfg)
    node = RolloutNode(paths, cfg, Spool(paths.root, cfg.spool), RealTaskOps(paths, cfg), policy,
                       NodeOptions(node_id="n0", workers=Workers(1, 4, 1), scratch=tmp_path / "node", once=True))
    try:
        return node.run()
    finally:
        policy.close()


def serve(model: Path, tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[bytes], str]:
    ready = tmp_path / "ready.json"
    log = open(tmp_path / "serve.log", "wb")  # noqa: SIM115 - lives as long as the server
    proc = subprocess.Popen([sys.executable, "-m", "hpc.cli", "serve", "--model", str(model), "--port", "0",
                             "--version", str(VERSION), "--threads", "1", "--ready-file", str(ready), *extra],
                            stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 180
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"spoolrl serve did not start: {(tmp_path / 'serve.log').read_text()[-2000:]}")
        time.sleep(0.2)
    return proc, str(json.loads(ready.read_text())["url"])


def announce(paths: RunPaths, url: str, name: str = "test") -> None:
    (paths.endpoints / f"infer-{name}.json").write_text(json.dumps(
        {"url": url, "version": VERSION, "heartbeat": 1, "role": "infer"}))


def run_against_server(paths: RunPaths, cfg: Any, tmp_path: Path, model: Path, *serve_args: str) -> str:
    """A real ``spoolrl serve`` announced in RUN/endpoints, one node pass over the run's tasks; its URL."""
    proc, url = serve(model, tmp_path, *serve_args)
    try:
        announce(paths, url)
        run_node(paths, cfg, tmp_path)
    finally:
        proc.kill()
        proc.wait()
    return url


@pytest.mark.parametrize("system_prompt", ["full", "brief"])
def test_llm_episodes_through_the_pipeline(tmp_path: Path, tiny_model: Path, system_prompt: str) -> None:
    paths, cfg = make_run(tmp_path, tiny_model, f"rollout.system_prompt={system_prompt}")
    url = run_against_server(paths, cfg, tmp_path, tiny_model)
    groups = written(paths, cfg)
    assert sorted(groups) == sorted(IDS)
    template = ChatTemplate.from_model_dir(tiny_model)
    for trajs in groups.values():
        assert sorted(t.sample_index for t in trajs) == [0, 1]
        for t in trajs:
            assert t.status in (Status.OK, Status.TRUNCATED) and t.reward == 0.0, (t.status, t.metrics)
            gen = t.loss_mask == 1
            assert gen.sum() > 0 and (t.policy_versions[gen] == VERSION).all()
            assert t.prompt_len > 0 and t.metrics["servers"] == [url]
            prompt = template.decode(t.token_ids[: t.prompt_len].tolist())  # rollout.system_prompt reached the agent
            assert SYSTEM_PROMPTS[system_prompt][:40] in prompt
            assert ('- bash {"command": str}' in prompt) == (system_prompt == "full")
    seeds = [t.sampling["seed"] for trajs in groups.values() for t in trajs]
    assert len(set(map(str, seeds))) == len(seeds)


def test_server_context_length_ends_episodes_as_truncated_not_inference_errors(tmp_path: Path,
                                                                                tiny_model: Path) -> None:
    """rollout.max_tokens (1536) is above what the server accepts (--max-model-len 700, unknown to the
    config): the agent reads the server's context length, so long episodes end as ``truncated`` inside
    it, trainable, in one attempt, instead of a 400 turned into a retried ``inference_error``."""
    limit = 700
    paths, cfg = make_run(tmp_path, tiny_model, "rollout.max_tokens=1536", "rollout.max_turns=40",
                          "rollout.max_new_tokens_per_turn=48")
    run_against_server(paths, cfg, tmp_path, tiny_model, "--max-model-len", str(limit))
    trajs = [t for ts in written(paths, cfg).values() for t in ts]
    assert len(trajs) == 4
    for t in trajs:
        assert t.status == Status.TRUNCATED and t.reward == 0.0, (t.status, t.metrics)
        assert t.metrics["sample_attempt"] == 0 and t.metrics["stop_reason"] == "context", (t.prompt_len, t.metrics)
        assert limit - 60 <= t.num_tokens <= limit and t.num_generated > 0


def test_dead_inference_server_is_an_excluded_inference_error(tmp_path: Path, tiny_model: Path) -> None:
    """A server that stays dead past inference.outage_wait_s (1 s here; the default waits out a restart)."""
    paths, cfg = make_run(tmp_path, tiny_model, "inference.outage_wait_s=1")
    # announced (fresh heartbeat) but nothing listens: every request fails
    (paths.endpoints / "infer-dead.json").write_text(json.dumps(
        {"url": f"unix://{tmp_path / 'nobody.sock'}", "version": VERSION, "heartbeat": 1, "role": "infer"}))
    run_node(paths, cfg, tmp_path)
    trajs = [t for ts in written(paths, cfg).values() for t in ts]
    assert len(trajs) == 4
    assert {(t.status, t.reward, t.metrics["sample_attempt"]) for t in trajs} == {(Status.INFERENCE_ERROR, None, 1)}
    assert Spool(paths.root, cfg.spool).stats()["tasks_claimed"] == 0


def test_a_server_restart_is_waited_out_not_a_fault_streak(tmp_path: Path, tiny_model: Path) -> None:
    """The node's only server is announced but down when the episodes start (a restart: killed, coming back
    on the same socket). With one infrastructure fault enough to stop the node, the episodes wait for it
    (inference.outage_wait_s) and end as the agent's outcomes; before the wait, the first request's failure
    was an inference_error and the node stopped itself."""
    paths, cfg = make_run(tmp_path, tiny_model, "rollout.max_consecutive_infra_faults=1",
                          "inference.outage_wait_s=120")
    sock = tmp_path / "restarting.sock"
    announce(paths, f"unix://{sock}")
    started: list[subprocess.Popen[bytes]] = []
    timer = threading.Timer(2.0, lambda: started.append(serve(tiny_model, tmp_path, "--uds", str(sock))[0]))
    timer.start()
    try:
        summary = run_node(paths, cfg, tmp_path)
    finally:
        timer.join()
        for proc in started:
            proc.kill()
            proc.wait()
    assert started, "the server came back"
    trajs = [t for ts in written(paths, cfg).values() for t in ts]
    assert len(trajs) == 4 and all(t.trainable for t in trajs), [(t.status, t.metrics.get("error")) for t in trajs]
    assert summary.get("failures", {}).get("inference_error", 0) == 0, summary


def test_no_announced_server_means_no_claims(tmp_path: Path, tiny_model: Path) -> None:
    """Claiming with no live server would only burn the task's retries as inference_error rows."""
    paths, cfg = make_run(tmp_path, tiny_model)
    policy = LLMPolicy(paths, cfg)
    node = RolloutNode(paths, cfg, Spool(paths.root, cfg.spool), RealTaskOps(paths, cfg), policy,
                       NodeOptions(node_id="n0", workers=Workers(1, 1, 1), scratch=tmp_path / "node", once=True))
    try:
        assert node.claims.may_claim() is False and node.claims.not_claiming == "no_inference_server"
        (paths.endpoints / "infer-a.json").write_text(json.dumps(
            {"url": "http://127.0.0.1:9", "version": VERSION, "heartbeat": 1, "role": "infer"}))
        time.sleep(1.1)  # the endpoint directory is rescanned at most once a second
        assert node.claims.may_claim() is True and node.claims.not_claiming == ""
    finally:
        policy.close()


def test_waiting_for_a_slow_server_is_not_charged_to_the_episode_limit(tmp_path: Path, tiny_model: Path) -> None:
    """An overloaded server (a stand-in answering after 0.8 s) makes four turns take ~3.2 s of LLM wait
    against rollout.run_timeout_s = 2: the episodes end by their turn budget, not as ``timeout``
    (server load must not inject reward-0 samples)."""
    from tests.agent.fake_engine import FakeEngine

    engine = FakeEngine(version=VERSION, delay_s=0.8)
    url = engine.start()
    try:
        paths, cfg = make_run(tmp_path, tiny_model, "rollout.run_timeout_s=2", "rollout.max_turns=4")
        announce(paths, url, "slow")
        run_node(paths, cfg, tmp_path)
    finally:
        engine.stop()
    trajs = [t for ts in written(paths, cfg).values() for t in ts]
    assert len(trajs) == 4
    for t in trajs:
        assert t.status == Status.TRUNCATED and t.metrics["stop_reason"] == "max_turns", t.metrics
        assert t.metrics["agent_generate_s"] > 2.0 and t.metrics["turns"] == 4
