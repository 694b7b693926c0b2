"""The inference client against a scriptable stand-in server: TCP and UDS, version spans, retries,
failover when a server dies mid-episode (a real SIGKILLed process), concurrency limit, liveness."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from fake_engine import FakeEngine

from hpc.config import InferenceConfig
from hpc.errors import InferenceError
from hpc.trajectory import Status
from rollout_node.agent import (
    AgentLimits,
    AgentLoop,
    ChatTemplate,
    Completion,
    Message,
    SamplingParams,
    ToolCall,
    ToolOutput,
)
from rollout_node.agent.client import InferenceClient, RetryPolicy
from rollout_node.agent.endpoints import EndpointDirectory

FAST = RetryPolicy(max_retries=3, outage_wait_s=0.0, backoff_base_s=0.01, backoff_max_s=0.05, cooldown_s=30.0)
SAMPLING = SamplingParams(max_tokens=6, seed=5, stop_token_ids=(2,))
HERE = Path(__file__).parent


@pytest.fixture
def engines() -> Iterator[list[FakeEngine]]:
    started: list[FakeEngine] = []
    yield started
    for e in started:
        e.stop()


def _start(engines: list[FakeEngine], **kw: object) -> tuple[FakeEngine, str]:
    e = FakeEngine(**kw)  # type: ignore[arg-type]
    engines.append(e)
    return e, e.start()


@pytest.mark.parametrize("transport", ["tcp", "uds"])
def test_completion_over_tcp_and_uds(engines: list[FakeEngine], tmp_path: Path, transport: str) -> None:
    e = FakeEngine(version=3, spans="split")
    engines.append(e)
    url = e.start(uds=str(tmp_path / "e.sock") if transport == "uds" else None)
    client = InferenceClient([url], retry=FAST)
    c = client.session("ep").generate([5, 6, 7], SAMPLING)
    assert c.token_ids == tuple(e.generate({"prompt": [5, 6, 7], "max_tokens": 6, "seed": 5})["choices"][0]["token_ids"])
    assert c.versions == (3, 3, 3, 4, 4, 4)  # from the server's spans, per token
    assert c.logprobs == (-1.0,) * 6 and c.server == url
    sent = e.requests[0]
    assert sent["prompt"] == [5, 6, 7] and sent["return_token_ids"] is True and sent["logprobs"] == 1
    assert (sent["seed"], sent["stop_token_ids"], sent["model"]) == (5, [2], "fake")
    assert client.max_model_len() == 4096
    client.close()


def test_missing_version_spans_is_an_error_not_a_guess(engines: list[FakeEngine]) -> None:
    e, url = _start(engines, spans="missing")
    with pytest.raises(InferenceError, match="weight_versions"):
        InferenceClient([url], retry=FAST).session("ep").generate([1, 2], SAMPLING)
    assert len(e.requests) == 1  # a protocol error is not retried


def test_transient_errors_are_retried_with_backoff(engines: list[FakeEngine]) -> None:
    e, url = _start(engines)
    e.script = [503, 500]
    c = InferenceClient([url], retry=FAST).session("ep").generate([1, 2], SAMPLING)
    assert len(c.token_ids) == 6 and len(e.requests) == 3


def test_client_errors_are_not_retried(engines: list[FakeEngine]) -> None:
    e, url = _start(engines)
    e.script = [400]
    with pytest.raises(InferenceError, match="HTTP 400"):
        InferenceClient([url], retry=FAST).session("ep").generate([1, 2], SAMPLING)
    assert len(e.requests) == 1


def test_sticky_then_failover_to_a_live_server(engines: list[FakeEngine]) -> None:
    (a, url_a), (b, url_b) = _start(engines), _start(engines)
    client = InferenceClient([url_a, url_b], retry=FAST)
    keys = [f"group-{i}" for i in range(20)]
    picks = {k: client.pick(k) for k in keys}
    assert set(picks.values()) == {url_a, url_b}  # groups spread over servers
    key = next(k for k, u in picks.items() if u == url_a)
    session = client.session(key)
    for _ in range(3):
        assert session.generate([1, 2, 3], SAMPLING).server == url_a  # sticky
    a.stop()
    c = session.generate([1, 2, 3, 4], SAMPLING)
    assert (c.server, session.failovers) == (url_b, 1)
    assert b.requests[-1]["prompt"] == [1, 2, 3, 4] and b.requests[-1]["seed"] == 5  # same request re-sent
    assert session.generate([1], SAMPLING).server == url_b


def test_no_server_raises_inference_error_after_bounded_attempts(tmp_path: Path) -> None:
    dead = f"unix://{tmp_path}/nobody.sock"
    t0 = time.monotonic()
    session = InferenceClient([dead, "http://127.0.0.1:9"], retry=FAST).session("ep")
    with pytest.raises(InferenceError, match="after 4 attempts"):
        session.generate([1], SAMPLING)
    assert len(session.errors) == 4 and time.monotonic() - t0 < 10


def test_an_outage_is_waited_out_then_given_up(tmp_path: Path) -> None:
    """The only server restarts (down 1.5 s, back on the same socket): with ``outage_wait_s`` the request is
    answered after the attempts are spent; without it the episode would have ended as inference_error."""
    patient = RetryPolicy(max_retries=1, outage_wait_s=30.0, backoff_base_s=0.05, backoff_max_s=0.2, cooldown_s=0.1)
    first, url = _spawn_fake(tmp_path, "s", delay_s=0.0)
    client = InferenceClient([url], retry=patient)
    session = client.session("ep")
    assert session.generate([1], SAMPLING).server == url
    first.kill()
    first.wait()
    (tmp_path / "s.ready").unlink()
    (tmp_path / "s.sock").unlink()  # a restarted server binds the same path anew
    restarted: list[subprocess.Popen[bytes]] = []
    timer = threading.Timer(1.5, lambda: restarted.append(_spawn_fake(tmp_path, "s", delay_s=0.0)[0]))
    timer.start()
    try:
        c = session.generate([1, 2], SAMPLING)
        assert c.server == url and len(session.errors) >= 2  # both attempts failed, then the wait paid off
    finally:
        timer.join()
        for p in restarted:
            p.kill()
            p.wait()
    given_up = InferenceClient([url], retry=RetryPolicy(max_retries=1, outage_wait_s=0.6, backoff_base_s=0.05,
                                                        backoff_max_s=0.1)).session("ep")
    t0 = time.monotonic()
    with pytest.raises(InferenceError, match=r"outage_wait_s=0.6"):
        given_up.generate([1], SAMPLING)
    assert 0.6 <= time.monotonic() - t0 < 10 and len(given_up.errors) > 2  # kept trying until the bound


def test_close_ends_an_outage_wait(tmp_path: Path) -> None:
    client = InferenceClient([f"unix://{tmp_path}/nobody.sock"], retry=RetryPolicy(outage_wait_s=300.0,
                                                                                   backoff_max_s=1.0))
    threading.Timer(0.5, client.close).start()
    t0 = time.monotonic()
    with pytest.raises(InferenceError, match="no inference server answered"):
        client.session("ep").generate([1], SAMPLING)
    assert time.monotonic() - t0 < 10


def test_concurrency_limit_per_server(engines: list[FakeEngine]) -> None:
    e, url = _start(engines, delay_s=0.05)
    client = InferenceClient([url], retry=FAST, max_concurrent_per_server=2)
    threads = [threading.Thread(target=lambda i=i: client.session(f"k{i}").generate([i + 1], SAMPLING))
               for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(e.requests) == 8 and e.max_in_flight == 2


def test_endpoint_liveness_follows_heartbeat_changes(tmp_path: Path) -> None:
    now = [100.0]
    d = EndpointDirectory(tmp_path, stale_after_s=10, rescan_s=0, clock=lambda: now[0])

    def announce(name: str, url: str, beat: int, role: str = "infer") -> None:
        (tmp_path / f"{name}.json").write_text(json.dumps({"url": url, "version": 1, "heartbeat": beat, "role": role}))

    announce("infer-0", "http://a:1", 1)
    announce("infer-1", "http://b:1", 1)
    announce("infer-2", "http://c:1", 1, role="rollout")
    (tmp_path / "infer-3.json").write_text("{half-writ")
    assert d.live() == ["http://a:1", "http://b:1"]
    now[0] += 8
    announce("infer-0", "http://a:1", 2)  # a beats, b does not
    assert d.live() == ["http://a:1", "http://b:1"]
    now[0] += 5
    assert d.live() == ["http://a:1"]
    (tmp_path / "infer-0.json").unlink()
    assert d.live() == []


def _spawn_fake(tmp_path: Path, name: str, delay_s: float) -> tuple[subprocess.Popen[bytes], str]:
    ready = tmp_path / f"{name}.ready"
    proc = subprocess.Popen([sys.executable, str(HERE / "fake_engine.py"), "--ready-file", str(ready),
                             "--delay-s", str(delay_s), "--uds", str(tmp_path / f"{name}.sock")],
                            env={**os.environ, "PYTHONPATH": str(HERE.parents[1])})  # this checkout's hpc
    for _ in range(200):
        if ready.exists():
            return proc, json.loads(ready.read_text())["url"]
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("fake engine did not start")


class _KillDuringTurn:
    """Wraps a session: SIGKILLs ``victim`` while turn ``at`` is in flight."""

    def __init__(self, session: object, victim: subprocess.Popen[bytes], at: int) -> None:
        self.session, self.victim, self.at, self.turn = session, victim, at, 0

    def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Completion:
        if self.turn == self.at:
            threading.Timer(0.1, lambda: os.kill(self.victim.pid, signal.SIGKILL)).start()
        self.turn += 1
        return self.session.generate(prompt_ids, sampling)  # type: ignore[attr-defined]


@pytest.mark.parametrize("servers", [2, 1])
def test_server_killed_mid_episode(template: ChatTemplate, tmp_path: Path, servers: int) -> None:
    """2 servers: the episode fails over and finishes; 1 server: it ends as inference_error. Either way the
    process running the loop (the node) survives, and no exception escapes the loop."""
    procs = [_spawn_fake(tmp_path, f"s{i}", delay_s=0.5) for i in range(servers)]
    try:
        client = InferenceClient([u for _, u in procs], retry=FAST)
        session = client.session("episode")
        first = client.pick("episode")
        victim = next(p for p, u in procs if u == first)
        loop = AgentLoop(template, AgentLimits(max_turns=4, max_new_tokens_per_turn=8))
        policy = _KillDuringTurn(session, victim, at=1)
        result = loop.run([Message("user", "go")], policy, _NoTools())
        victim.wait(timeout=10)
        if servers == 2:
            assert (result.status, result.stop_reason, len(result.turns)) == (Status.TRUNCATED, "max_turns", 4)
            assert session.failovers == 1
            assert [t.completion.server for t in result.turns] == [first] + [session.server] * 3
        else:
            assert (result.status, len(result.turns)) == (Status.INFERENCE_ERROR, 1)
            assert "no inference server answered" in result.error
    finally:
        for p, _ in procs:
            p.kill()
            p.wait()


class _NoTools:
    def execute(self, call: ToolCall) -> ToolOutput:
        raise AssertionError("the fake engine's IDs never form a tool call")

    def submit(self) -> ToolOutput:
        raise AssertionError("never submits")


def test_client_from_config_reads_run_endpoints(engines: list[FakeEngine], tmp_path: Path) -> None:
    from hpc.config.inference import InferenceConfig

    e, url = _start(engines, version=9)
    (tmp_path / "endpoints").mkdir()
    (tmp_path / "endpoints" / "infer-n0-0.json").write_text(
        json.dumps({"url": url, "version": 9, "heartbeat": 1, "role": "infer"}))
    client = InferenceClient.from_config(InferenceConfig(max_retries=1), run_dir=tmp_path)
    assert client.retry.max_retries == 1
    c = client.session("ep").generate([4, 2], SAMPLING)
    assert c.server == url and set(c.versions) == {9} and len(e.requests) == 1


def test_client_defaults_are_the_configs() -> None:
    """RetryPolicy and the client state no default of their own for a config knob."""
    cfg = InferenceConfig()
    assert RetryPolicy() == RetryPolicy.from_config(cfg)
    client = InferenceClient(["http://127.0.0.1:1"])
    assert (client.request_timeout_s, client.max_concurrent) == (cfg.request_timeout_s, cfg.max_concurrent_per_server)


def test_a_stopped_episode_abandons_its_request_in_flight(engines: list[FakeEngine]) -> None:
    """The server takes 30 s; the episode stops after 0.5 s: the request is abandoned within a slice and its
    connection closed (the server sees the client go), not held until the answer or the 120-s timeout."""
    e, url = _start(engines, delay_s=30.0)
    client = InferenceClient([url], retry=FAST)
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    t0 = time.monotonic()
    with pytest.raises(InferenceError, match="stopped while its request"):
        client.session("ep", stopped=stop.is_set).generate([1, 2], SAMPLING)
    assert 0.4 < time.monotonic() - t0 < 3.0
    assert len(e.requests) == 1, "abandoned, not retried"
    # a session that is not stopped still gets its answer over the same transport
    e.delay_s = 0.0
    assert client.session("ep2", stopped=lambda: False).generate([3], SAMPLING).token_ids
