"""``spoolrl demo rollout.policy=harness``: the whole loop with a harness (issue 32 item 5), as the README runs it.

The example harness (``examples/harness``: a stdlib OpenAI chat-completions client with bash / str_replace /
submit tools), installed by ``spoolrl harness install``, runs in a bwrap sandbox per episode against the rollout
node's gateway; the real CPU engine samples the warm-started tiny model behind it; EVAL scores the working
tree's diff; the DeepSpeed trainer trains the spooled trajectories, publishes, and the engine reloads. Two
steps of 1 task x 2 samples (the demo's defaults are 4 x 8: the shape is cut to keep the test short).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hpc.metrics import read_metrics
from hpc.shard import read_shard_file, table_trajectories
from tests.harness.conftest import example_install, spoolrl

pytestmark = [pytest.mark.e2e, pytest.mark.sandbox, pytest.mark.deepspeed]
COMMAND = "spoolrl-example-agent --max-turns 3 --no-tools-field"  # what the README's demo line gives
GROUP, GROUPS, STEPS = 2, 1, 2


def test_demo_trains_the_example_harness_through_the_gateway(tmp_path: Path,
                                                            tmp_path_factory: pytest.TempPathFactory) -> None:
    prefix = example_install(tmp_path_factory)
    run = tmp_path / "run"
    done = spoolrl("demo", "--out", str(run), "--steps", str(STEPS), "rollout.policy=harness",
                   f"rollout.harness.prefix={prefix}", f"rollout.harness.command={COMMAND}",
                   f"algorithm.group_size={GROUP}", f"algorithm.groups_per_step={GROUPS}",
                   f"trainer.max_tasks_outstanding={GROUPS}", timeout_s=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads(done.stdout.splitlines()[-1])
    assert summary["demo"] == "summary" and summary["step"] == STEPS and summary["role_errors"] == {}

    # each task trained exactly once: the steps' tasks are disjoint, every sample of each committed once
    steps = sorted(read_metrics(run, "train_step"), key=lambda r: r["step"])
    tasks = [t for s in steps for t in s["task_ids"]]
    assert [s["step"] for s in steps] == [1, 2] and len(tasks) == len(set(tasks)) == STEPS * GROUPS
    trajs = [t for p in sorted((run / "spool" / "shards" / "committed").glob("*.shard"))
             for t in table_trajectories(read_shard_file(p), str(p))]
    assert sorted((t.task_id, t.sample_index) for t in trajs) == sorted((t, i) for t in tasks for i in range(GROUP))
    assert summary["spool"]["trajectories_committed"] == len(trajs)
    assert summary["spool"]["trajectories_dropped_duplicate"] == 0

    # through the gateway: the harness's calls recorded as segments, sampled at the run's temperature
    for t in trajs:
        m = t.metrics
        assert m["segments_per_episode"] == 1 and m["harness_calls"] >= 1 and m["gateway_llm_s"] > 0, m
        assert t.sampling["temperature"] == 0.7 and t.num_generated > 0 and t.reward in (0.0, 1.0)
    episodes = [e for e in read_metrics(run, "episode") if e["task_id"] in tasks]
    assert len(episodes) == len(trajs) and all(e["segments_per_episode"] == 1 for e in episodes)

    # the trainer published every step and the engine reloaded each version. The tokens carry the version that
    # sampled them: step 1's were sampled before v1 existed, step 2's before v2 did. (Whether step 2 ran on v0
    # or v1 is timing: its task is issued when v1 is published, the engine picks v1 up about a second later,
    # and algorithm.max_staleness allows v0; the CI run of 2026-12-06 saw v0.)
    reloads = [r["version"] for r in read_metrics(run, "reload")]
    assert summary["trainer"]["policy_version"] == STEPS and reloads[:1] == [1], reloads
    for k, step in enumerate(steps):
        sampled = {int(v) for t in trajs if t.task_id in step["task_ids"] for v in t.policy_versions if v >= 0}
        assert sampled and sampled <= set(range(k + 1)), (step["step"], sampled)

    # the reward figures and the harness's segments, in the summary and on stderr
    assert summary["reward_first"] is not None and summary["reward_last"] is not None
    assert summary["harness"]["episodes"] >= len(trajs) and summary["harness"]["reprefill_tokens"] == 0
    assert f"harness episodes {summary['harness']['episodes']}: 1.00 segments per episode" in done.stderr
    assert "spoolrl demo: reward " in done.stderr and f"next: spoolrl report {run}" in done.stderr
