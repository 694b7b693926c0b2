"""``rollout.policy: harness`` through the real rollout node: the spool, INIT, a bwrap sandbox with no
network, the real gateway on its Unix socket, the loopback relay, the real EVAL and the shard writer.

The backend behind the gateway is a stand-in (no LLM here: :class:`ScriptedBackend` returns fixed token
IDs and records what it was sent). The harnesses are real programs installed by ``spoolrl harness
install``: the unmodified mini-swe-agent 2.4.6 from PyPI, the unmodified Codex CLI 0.171.0 from npm (through
the gateway's Responses API), and a stand-in harness (a stdlib OpenAI
client, ``tests/harness/standin``) for the behaviours no real harness shows on demand (history
truncation, a crash, a hang, a network probe).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from hpc.config import AlgorithmConfig, load_config
from hpc.errors import InferenceError
from hpc.paths import RunPaths
from hpc.rundir import create_run
from hpc.spool import Spool
from hpc.trajectory import Status, Trajectory
from rollout_node.agent.policy import Completion, SamplingParams
from rollout_node.agent.toolcall import format_tool_call
from rollout_node.gateway.server import Gateway
from rollout_node.gateway.session import GatewaySampling
from rollout_node.pipeline.agentscript import bash, byte_template
from rollout_node.pipeline.bindings import RealTaskOps
from rollout_node.pipeline.harness import HARNESS_INSIDE, HarnessPolicy, ScriptedBackend
from rollout_node.pipeline.node import NodeOptions, RolloutNode
from rollout_node.pipeline.sizing import Workers
from tests.harness.conftest import spoolrl
from tests.pipeline.readback import written
from train_node.trainer.consumer import Consumer

# one test at a time (scripts/test.sh): harness_processes() looks at every process on the machine
pytestmark = pytest.mark.serial

TASK = "spoolrl__intervals-1"
RIGHT_FIX = bash("sed -i 's/self.start <= x <= self.end/self.start <= x < self.end/' intervals/interval.py")
WRONG_FIX = bash("sed -i 's/self.start <= x <= self.end/self.start < x <= self.end/' intervals/interval.py")
MINI_SUBMIT = bash("echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT")
MINI_COMMAND = 'mini -y --exit-immediately -m openai/policy -t "$(cat "$SPOOLRL_TASK_FILE")"'
MINI_ENV = {"MSWEA_CONFIGURED": "true", "MSWEA_COST_TRACKING": "ignore_errors"}
# Codex CLI: a custom provider on the gateway (Responses API); its own sandbox and approvals off (the episode
# sandbox confines it); its tools that are not functions (web_search, the multi-agent namespace) off; the task on stdin
CODEX_COMMAND = ("codex exec --dangerously-bypass-approvals-and-sandbox --skip-git-repo-check --disable multi_agent "
                 "-c web_search=disabled -m policy -c model_provider=spoolrl -c model_providers.spoolrl.name=spoolrl "
                 "-c \"model_providers.spoolrl.base_url=\\\"$OPENAI_BASE_URL\\\"\" "
                 "-c model_providers.spoolrl.env_key=OPENAI_API_KEY -c model_providers.spoolrl.wire_api=responses -")


def make_run(tmp_path: Path, prefix: Path, command: str, env: dict[str, str], **rollout: Any) -> tuple[RunPaths, Any]:
    data = {"trainer": {"precision": "fp32"}, "slurm": {"train": {"gpus_per_node": 0}}, "model": {"path": "/nonexistent"},
            "spool": {"poll_interval_s": 0.1, "heartbeat_interval_s": 1, "lease_s": 60, "shard_max_age_s": 1},
            "sandbox": {"scratch_dir": str(tmp_path / "scratch")},
            "rollout": {"policy": "harness", "max_retries": 0, "metrics_interval_s": 1, **rollout,
                        "harness": {"command": command, "env": env, "prefix": str(prefix)}}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(data))
    cfg = load_config(tmp_path / "run.yaml")
    return create_run(tmp_path / "run", cfg), cfg


def run_node(paths: RunPaths, cfg: Any, tmp_path: Path, backends: Sequence[Any]) -> dict[str, Any]:
    """One group of ``len(backends)`` samples of TASK; sample ``i`` talks to ``backends[i]``."""
    Spool(paths.root, cfg.spool).put_tasks([{"task_id": f"{TASK}@e0", "instance_id": TASK, "epoch": 0,
                                             "group_size": len(backends), "policy_version": 0}])
    sampling = GatewaySampling(temperature=1.0, max_tokens=1 << 22, max_new_tokens=1 << 16)
    policy = HarnessPolicy(cfg.rollout.harness, Gateway(tmp_path / "gw.sock").start(), byte_template(),
                           lambda ctx: sampling, lambda ctx: backends[ctx.sample_index])
    opts = NodeOptions(node_id="n0", workers=Workers(1, min(3, len(backends)), 2), scratch=tmp_path / "node", once=True)
    node = RolloutNode(paths, cfg, Spool(paths.root, cfg.spool), RealTaskOps(paths, cfg), policy, opts)
    return node.run()


def harness_processes() -> list[str]:
    """Command lines of live processes that belong to a harness (its prefix is in their argv)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if HARNESS_INSIDE in cmd or "standin-harness" in cmd:
            found.append(cmd)
    return found


def assert_token_exact(t: Trajectory, backend: ScriptedBackend, calls: slice) -> None:
    """The trajectory is the last prompt the gateway sent + what the backend returned, and every earlier
    call of the segment is a prefix with its completion trained (mask 1) and nothing else."""
    prompts, completions = backend.prompts[calls], backend.completions[calls]
    assert list(t.token_ids) == [*prompts[-1], *completions[-1]]
    trained: set[int] = set()
    for prompt, completion in zip(prompts, completions, strict=True):
        assert list(t.token_ids[: len(prompt) + len(completion)]) == [*prompt, *completion]
        trained.update(range(len(prompt), len(prompt) + len(completion)))
    assert {i for i, m in enumerate(t.loss_mask) if m} == trained
    assert t.prompt_len == len(prompts[0])


def episode_records(paths: RunPaths) -> list[str]:
    return [line for f in paths.root.rglob("*.jsonl") for line in f.read_text().splitlines()
            if '"episode"' in line and "segments_per_episode" in line]


def right_and_wrong(tmp_path: Path, prefix: Path, command: str, env: dict[str, str],
                    right: ScriptedBackend, wrong: ScriptedBackend) -> tuple[RunPaths, list[Trajectory]]:
    """One group of two samples, the right fix then the wrong one: rewards 1 and 0, both trainable, each one
    token-exact segment of 2 gateway calls (the harness resent its history unchanged)."""
    paths, cfg = make_run(tmp_path, prefix, command, env)
    summary = run_node(paths, cfg, tmp_path, [right, wrong])
    trajs = sorted(written(paths, cfg)[f"{TASK}@e0"], key=lambda t: t.sample_index)
    assert summary["statuses"] == {"ok": 2}
    assert [(t.sample_index, t.status, t.reward) for t in trajs] == [(0, Status.OK, 1.0), (1, Status.OK, 0.0)]
    for t, backend in zip(trajs, (right, wrong), strict=True):
        assert t.metrics["segments_per_episode"] == 1 and t.metrics["harness_calls"] == 2 == len(backend.prompts)
        assert t.metrics["harness_exit_code"] == 0 and t.trainable
        assert_token_exact(t, backend, slice(None))
    return paths, trajs


def test_mini_swe_agent_fixes_the_task_in_bwrap_through_the_gateway(tmp_path: Path, mini_prefix: Path) -> None:
    template = byte_template()
    right = ScriptedBackend(template, [RIGHT_FIX, MINI_SUBMIT])
    wrong = ScriptedBackend(template, [WRONG_FIX, MINI_SUBMIT])
    paths, trajs = right_and_wrong(tmp_path, mini_prefix, MINI_COMMAND, MINI_ENV, right, wrong)
    # the harness saw the task (mini renders it into its first user message) and the tool's output
    first = template.decode(list(right.prompts[0]))
    assert "Interval.contains() includes the end point" in first and "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT" in first
    assert "intervals/interval.py" in trajs[0].metrics["diff"] and ".config" not in trajs[0].metrics["diff"]
    assert len(episode_records(paths)) == 2, "the node's metrics records carry segments_per_episode"
    assert harness_processes() == []


def codex_fix(sed: str) -> str:
    """A Codex tool call (its ``exec_command`` function) that runs ``sed`` on the task's file."""
    return format_tool_call("exec_command", {"cmd": f"sed -i '{sed}' intervals/interval.py"})


def test_codex_cli_fixes_the_task_in_bwrap_through_the_responses_api(tmp_path: Path, codex_prefix: Path) -> None:
    template = byte_template()
    right = ScriptedBackend(template, [codex_fix("s/self.start <= x <= self.end/self.start <= x < self.end/"),
                                       "Fixed: the end point is excluded."])
    wrong = ScriptedBackend(template, [codex_fix("s/self.start <= x <= self.end/self.start < x <= self.end/"),
                                       "Fixed."])
    _, trajs = right_and_wrong(tmp_path, codex_prefix, CODEX_COMMAND, {}, right, wrong)  # Codex resends its items
    first, second = (template.decode(list(p)) for p in right.prompts)
    assert "Interval.contains() includes the end point" in first and "exec_command" in first
    assert "Process exited with code 0" in second  # Codex's function_call_output, rendered as a tool response
    assert "intervals/interval.py" in trajs[0].metrics["diff"] and ".codex" not in trajs[0].metrics["diff"]
    assert harness_processes() == []


def test_harness_check_passes_codex_through_its_own_shell_tool(codex_prefix: Path) -> None:
    """``spoolrl harness check DIR --command <codex exec ...>``: the scripted check calls the shell tool Codex
    offers (``exec_command``, not mini-swe-agent's ``bash``), then ends it with a plain answer."""
    check = spoolrl("harness", "check", str(codex_prefix), "--command", CODEX_COMMAND)
    assert check.returncode == 0, check.stdout + check.stderr
    lines = check.stdout.splitlines()
    assert [ln.split(":")[0] for ln in lines] == ["ok   install", "ok   scripts", "ok   gateway", "ok   episode"], lines
    assert "working tree changed" in lines[3] and "1 segment(s)" in lines[3], lines[3]


def test_standin_harness_outcomes_segments_and_no_network(tmp_path: Path, standin_prefix: Path) -> None:
    template = byte_template()

    class Failing:
        def generate(self, prompt_ids: Sequence[int], sampling: SamplingParams) -> Completion:
            raise InferenceError("stand-in backend: no server could answer")

    truncating = ScriptedBackend(template, [bash("echo first"), bash("@truncate"), RIGHT_FIX, bash("@done")],
                                 logprob_kind="processed")
    crashing = ScriptedBackend(template, [bash("@crash")], logprob_kind="processed")
    probing = ScriptedBackend(template, [bash("@net"), bash("@done")], logprob_kind="processed")
    hanging = ScriptedBackend(template, [bash("@sleep")], logprob_kind="processed")
    paths, cfg = make_run(tmp_path, standin_prefix, "standin-harness", {}, run_timeout_s=12.0)
    summary = run_node(paths, cfg, tmp_path, [truncating, crashing, probing, hanging, Failing()])
    rows = written(paths, cfg)[f"{TASK}@e0"]
    by_sample: dict[int, list[Trajectory]] = {}
    for t in rows:
        by_sample.setdefault(t.sample_index, []).append(t)
    assert summary["statuses"] == {"ok": 3, "timeout": 1, "inference_error": 1}
    # a harness that truncated its history: two segments, each with its own prompt, sharing the reward
    first, second = sorted(by_sample[0], key=lambda t: t.metrics["segment"])
    assert [(t.status, t.reward, t.metrics["segments_per_episode"]) for t in (first, second)] == [(Status.OK, 1.0, 2)] * 2
    assert first.trajectory_id.endswith(":seg0") and second.trajectory_id == f"{TASK}@e0:s0:a0"
    assert_token_exact(first, truncating, slice(0, 2))
    assert_token_exact(second, truncating, slice(2, 4))
    assert 0 < second.metrics["reprefill_tokens"] <= len(truncating.prompts[2])
    # crash, exit without a change, timeout: the agent's outcomes (reward 0, trainable)
    for i, status, exit_code in ((1, Status.OK, 3), (2, Status.OK, 0), (3, Status.TIMEOUT, None)):
        (t,) = by_sample[i]
        assert (t.status, t.reward, t.trainable, t.metrics["harness_exit_code"]) == (status, 0.0, True, exit_code), i
    # the network probe reached nothing but the gateway
    told = template.decode(list(probing.prompts[1]))
    assert told.count("unreachable") == 3, told[-600:]
    # a backend failure is infrastructure: excluded, with the reason
    (failed,) = by_sample[4]
    assert failed.status == Status.INFERENCE_ERROR and failed.reward is None
    assert "no server could answer" in failed.metrics["error"]
    assert harness_processes() == [], "the harness's tree (the hung one's sleep included) is dead"
    # the trainer's consumer: both segments trained, with one advantage: the sample counts once
    spool = Spool(paths.root, cfg.spool)
    spool.fence("t")
    consumer = Consumer(spool, "t", AlgorithmConfig(group_size=5, groups_per_step=1, drop_zero_variance=False,
                                                    advantage_norm="group_mean"), max_seq_len=1 << 20)
    consumer.poll()
    batch = consumer.next_batch(trainer_version=0, num_groups=1)
    assert batch is not None
    advantage = {s.trajectory_id: s.advantage for s in batch.samples}
    assert set(advantage) == {t.trajectory_id for t in rows if t.sample_index != 4}
    assert advantage[first.trajectory_id] == advantage[second.trajectory_id] == 1.0 - 1.0 / 4


def test_mini_swe_agent_in_apptainer(tmp_path: Path, mini_prefix: Path) -> None:
    """The same install in an apptainer sandbox (``--network none``): one scripted mini-swe-agent episode
    through the relay and the gateway fixes the task's work tree, one token-exact segment."""
    from rollout_node.pipeline.harness import run_harness
    from rollout_node.sandbox import open_sandbox
    from rollout_node.sandbox.runtimes import apptainer_unavailable_reason, find_apptainer
    from rollout_node.tasks import collect_diff, ensure_builtin_repos, load_tasks, prepare_workdir

    if not find_apptainer():
        pytest.skip(f"component unavailable: {apptainer_unavailable_reason()}")
    cfg = load_config(None, [f"sandbox.scratch_dir={tmp_path}", "sandbox.runtime=apptainer", "rollout.policy=harness",
                             f"rollout.harness.prefix={mini_prefix}", "rollout.harness.command=mini"])
    task = next(t for t in load_tasks("builtin") if t.instance_id == TASK)
    ensure_builtin_repos(tmp_path / "repos")
    prepare_workdir(task, tmp_path / "work", tmp_path / "repos", 120.0)
    backend = ScriptedBackend(byte_template(), [RIGHT_FIX, MINI_SUBMIT])
    harness = dataclasses.replace(cfg.rollout.harness, command=MINI_COMMAND, env=MINI_ENV)
    with Gateway(tmp_path / "gw.sock").start() as gateway, open_sandbox(cfg.sandbox, tmp_path / "work") as sb:
        session = gateway.open_session("apptainer", backend, byte_template(),
                                       GatewaySampling(temperature=1.0, max_tokens=1 << 22, max_new_tokens=1 << 16))
        result = run_harness(sb, harness, key=session.key, socket_path=session.socket_path,
                             problem=task.problem_statement, stop=lambda: False, timeout_s=300.0)
        trace = session.close()
    assert result.exit_code == 0 and sb.runtime.name == "apptainer", result.output[-2000:]
    assert (trace.calls, len(trace.segments), trace.error) == (2, 1, None)
    assert list(trace.segments[0].token_ids) == [*backend.prompts[-1], *backend.completions[-1]]
    assert "self.start <= x < self.end" in collect_diff(tmp_path / "work", task, tmp_path / "repos")
