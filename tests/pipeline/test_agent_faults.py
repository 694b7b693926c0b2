"""Issue 13, point 4: faults the agent causes are its own outcome - a trainable status, reward 0,
exactly one attempt (no retry, no fault record) - and the node goes on.

One real rollout node on real bwrap sandboxes, the built-in tasks and the real EVAL, driven by the
scripted policy's hostile actions through the REAL agent loop (rollout_node/pipeline/agentscript.py);
``rollout.max_retries=1``, so a fault classified as infrastructure would show as a second attempt.
A gold task runs in the same node before and after them and must still score 1.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from hpc.spool import Spool
from hpc.trajectory import Status, Trajectory
from rollout_node.pipeline.agentscript import SCRIPTS
from rollout_node.pipeline.sizing import Workers
from rollout_node.tasks import load_tasks
from tests.pipeline.readback import written
from tests.pipeline.test_node_real import _need_sandbox, make_run, run_node

pytestmark = pytest.mark.sandbox
FAULTS = sorted(SCRIPTS)
_need_sandbox = _need_sandbox  # the real-sandbox precondition, shared with test_node_real


@pytest.fixture(scope="module")
def outcome(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run every hostile action once (task id = action name) plus gold tasks before and after."""
    tmp = tmp_path_factory.mktemp("agent-faults")
    iid = load_tasks("builtin")[0].instance_id
    plan = ";".join(f"{a}={a}" for a in FAULTS) + ";*=gold"
    paths, cfg = make_run(tmp, f"rollout.scripted_plan={plan}", "algorithm.group_size=1",
                          "algorithm.drop_zero_variance=false", "rollout.run_timeout_s=240")
    names = ["gold_first", *FAULTS, "gold_last"]
    Spool(paths.root, cfg.spool).put_tasks([{"task_id": n, "instance_id": iid, "group_size": 1} for n in names])
    summary = run_node(paths, cfg, tmp, Workers(2, 4, 2))
    records = [json.loads(line) for f in (paths.root / "metrics").glob("rollout-*.jsonl")
               for line in f.read_text().splitlines() if line.strip()]
    return {"groups": written(paths, cfg), "faults": [r for r in records if r.get("kind") == "fault"],
            "summary": summary}


def _only(outcome: dict[str, Any], task_id: str) -> Trajectory:
    (t,) = outcome["groups"][task_id]
    return t


@pytest.mark.parametrize("fault", FAULTS)
def test_agent_fault_is_trainable_reward_zero_one_attempt(outcome: dict[str, Any], fault: str) -> None:
    t = _only(outcome, fault)
    assert t.status == Status.OK and t.trainable, (fault, t.status, t.metrics.get("error"))
    assert t.reward == 0.0, f"{fault}: the bug is still there, so the reward must be 0"
    assert t.metrics["sample_attempt"] == 0 and "previous_errors" not in t.metrics, "retried: a re-roll"
    assert t.metrics["eval_tries"] <= 1
    assert [r for r in outcome["faults"] if r.get("task_id") == fault] == [], "recorded as a fault"
    if str(t.metrics.get("unscorable", "")).startswith("the sandbox failed"):
        return  # the broken tree took the sandbox down before the submit (seen under load for 'fifo'): still its outcome
    assert t.metrics["scripted_action"] == fault and t.metrics["submitted"], "the loop ran to the submit"
    assert t.metrics["turns"] == len(SCRIPTS[fault]) + 1


def test_the_node_keeps_running(outcome: dict[str, Any]) -> None:
    assert sorted(outcome["groups"]) == sorted(["gold_first", "gold_last", *FAULTS])
    assert [(t.status, t.reward) for t in (_only(outcome, "gold_first"), _only(outcome, "gold_last"))] == \
        [(Status.OK, 1.0)] * 2
    assert outcome["summary"]["statuses"] == {"ok": len(FAULTS) + 2}


def _observations(outcome: dict[str, Any], fault: str) -> list[str]:
    return [str(o) for o in _only(outcome, fault).metrics["observations"]]


def test_fifo_over_tracked_files_makes_the_diff_unscorable(outcome: dict[str, Any]) -> None:
    t = _only(outcome, "fifo")
    assert t.metrics["eval_status"] == "unscorable" and t.metrics["eval_tries"] == 0
    assert "a FIFO" in t.metrics["unscorable"] and "a socket" in t.metrics["unscorable"]


def test_bad_json_calls_are_observations(outcome: dict[str, Any]) -> None:
    obs = _observations(outcome, "bad_json")
    assert len(obs) == len(SCRIPTS["bad_json"]) + 1
    assert all(o.startswith("error: ") for o in obs[:-1]), obs
    assert obs[-1].startswith("submit")  # the pipeline scores the host-side diff, not this observation
    assert _only(outcome, "bad_json").metrics["tool_calls"] == 1, "none but the submit ran a tool"


def test_control_dir_removed_turns_the_python_tool_off(outcome: dict[str, Any]) -> None:
    obs = _observations(outcome, "rm_control")
    assert "python tool unavailable" in obs[1] and "python tool unavailable" in obs[3], obs
    assert "a new shell was started" in obs[2] and obs[4].startswith("still-here"), obs


def test_killed_and_patched_python_server_are_results(outcome: dict[str, Any]) -> None:
    obs = _observations(outcome, "kill_pytool")
    assert "interpreter died" in obs[0] and obs[1].startswith("back"), obs
    assert "interpreter died" in obs[3] and obs[4].startswith("again"), "a deep reply is a dead server"
    assert obs[6] == "", "a garbage reply's fields are dropped, not trusted"


def test_forged_markers_and_killed_shells_are_results(outcome: dict[str, Any]) -> None:
    forged = _observations(outcome, "forge_marker")
    assert forged[0] == "early" and forged[1].startswith("late"), "a forged marker ends a call early: desync"
    assert ":99999999\x1eafter-huge" in forged[2] and ":abc\x1eafter-text" in forged[3], "output, not markers"
    killed = _observations(outcome, "kill_shell")
    assert any(o.startswith("one") for o in killed) and any("two" in o for o in killed), killed
    assert any(o.startswith("three") for o in killed), killed
