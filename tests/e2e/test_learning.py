"""``spoolrl demo`` through every real component (CPU engine with a live reload every step, agent loop,
bwrap sandboxes, tamper-proof EVAL, spool, DeepSpeed) on the learnable family.

With its defaults (sampling at temperature 0.7, so the trainer's logprobs at T are exercised; a policy
reload after every step; 40 steps with the KL-adaptive lr, ``trainer.target_kl``, and the step-wide baseline,
``algorithm.advantage_norm=batch_mean``) the demo learns: the mean reward of the first 3 steps is <= 0.4 and of
the last 5 >= 0.7, and the report's reward series is the one the trainer logged. The loop is not bitwise
reproducible (the engine's batching follows timing), so this is a statistical claim, measured in the README's
table: with the per-sample KL target seeds 0, 1 and 2, T 0.8 and seed 1 at T 0.8 ended at 0.84-0.89 over the
last 5 from 0.22-0.27; with the per-token target (issue 34) this test's last three runs here ended at 0.78,
0.83 and 0.84 from 0.26-0.27 (the plateau after step ~25 swings 0.62-1.0 a step: issue 12's 0.8 failed once);
with the CPU engine's prefix cache on (since off by default) 0.75 in the suite and 0.68 alone, a failure. With a
group baseline one run of six ended at 0.69; before ``trainer.target_kl`` 5 runs of 9 ended below 0.8. With
``trainer.lr=0`` the reward stays at the warm-start level (~1/4): the control below."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hpc.metrics import read_metrics

pytestmark = [pytest.mark.e2e, pytest.mark.sandbox, pytest.mark.deepspeed]
SPOOLRL = [sys.executable, "-m", "hpc.cli"]


def demo(run: Path, *overrides: str, steps: int | None = None, timeout_s: float = 900) -> dict[str, Any]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    argv = [*SPOOLRL, "demo", "--out", str(run), *(["--steps", str(steps)] if steps else []), *overrides]
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout_s, stdin=subprocess.DEVNULL)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
    shown = [x for x in lines if x["demo"] == "step"]
    summary = lines[-1]
    assert summary["demo"] == "summary" and summary["role_errors"] == {}, summary
    assert [x["step"] for x in shown] == list(range(1, summary["step"] + 1)), "every step's reward is printed"
    assert "reward" in out.stderr and "->" in out.stderr, out.stderr[-1000:]
    return summary


def episode_rewards(run: Path, steps: list[dict[str, Any]]) -> list[float]:
    """Per step, the mean reward of every finished episode of its tasks (``train_step.task_ids``)."""
    by_task: dict[str, list[float]] = {}
    for e in read_metrics(run, "episode"):
        if isinstance(e.get("reward"), (int, float)):
            by_task.setdefault(e["task_id"], []).append(float(e["reward"]))
    out = []
    for step in steps:
        values = [v for t in step["task_ids"] for v in by_task.get(t, [])]
        out.append(sum(values) / len(values))
    return out


def test_lr0_stays_near_the_warm_start_level(tmp_path: Path) -> None:
    control = demo(tmp_path / "lr0", "trainer.lr=0", steps=5)
    assert control["reward_first"] <= 0.5 and control["reward_last"] <= 0.5, control
    rewards = [r["reward_mean"] for r in read_metrics(tmp_path / "lr0", "train_step")]
    # 5 steps x 32 episodes: the learning run's first steps (lr still low) measured 0.12-0.31 per step
    assert len(rewards) == 5 and abs(sum(rewards) / len(rewards) - 0.25) <= 0.15, rewards


@pytest.mark.timeout(1500)
def test_the_demo_learns_with_its_defaults(tmp_path: Path) -> None:
    run = tmp_path / "learn"
    summary = demo(run, timeout_s=1400)
    first, last = summary["reward_first"], summary["reward_last"]
    assert summary["reward_first_steps"] == 3 and summary["reward_last_steps"] == 5
    steps = sorted(read_metrics(run, "train_step"), key=lambda r: r["step"])
    rewards = episode_rewards(run, steps)  # the reward the demo prints: every finished episode of the step's tasks
    assert abs(sum(rewards[:3]) / 3 - first) < 1e-3 and abs(sum(rewards[-5:]) / 5 - last) < 1e-3, (first, last)
    assert first <= 0.4 and last >= 0.7, (first, last, rewards)
    assert summary["policy_version"] == summary["step"] == len(steps) >= 40, "a reload after every step"
    assert all(r["step_kl"] >= 0 for r in steps), "the KL-adaptive lr measured every step"
    # on-policy at T = 0.7: the trainer's logprobs log_softmax(logits / T) match what the engine sampled with
    assert all(r["ratio_dev"] < 0.05 for r in steps), [round(r["ratio_dev"], 4) for r in steps]
    report = subprocess.run([*SPOOLRL, "report", str(run)], capture_output=True, text=True, timeout=300,
                            stdin=subprocess.DEVNULL)
    assert report.returncode == 0, report.stderr[-2000:]
    series = json.loads((run / "report" / "report.json").read_text())["series"]["reward"][
        "reward (every finished episode of the step's tasks)"]
    plotted = [y for _, y in sorted(zip(series["x"], series["y"], strict=True))]
    assert abs(sum(plotted[:3]) / 3 - first) < 1e-3 and abs(sum(plotted[-5:]) / 5 - last) < 1e-3, plotted
    assert (run / "report" / "reward.png").is_file()
