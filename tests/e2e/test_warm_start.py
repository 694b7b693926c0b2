"""The demo's warm start teaches the format, not the answer: before any RL step the episodes are
well formed and the written value is independent of the statement (reward ~ 1/K)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hpc.cli.demo_model import expected_reward, measure, warm_model
from rollout_node.tasks.builtin.pick import VALUES

pytestmark = [pytest.mark.e2e]


def test_warm_start_is_well_formed_and_independent_of_the_statement() -> None:
    model = warm_model(seed=0)
    m = measure(model, episodes=48, temperature=0.7)
    k = len(VALUES)
    assert m["well_formed_share"] >= 0.9, m
    assert m["value_mass"] >= 0.95, m  # the value slot holds one of the K values
    assert abs(m["expected_reward"] - 1 / k) <= 0.05, m
    # Independence: whatever the statement names, the value distribution is the same (no diagonal).
    rows = list(m["mean_probs_by_answer"].values())
    for i in range(k):
        column = [row[i] for row in rows]
        assert max(column) - min(column) <= 0.05, m["mean_probs_by_answer"]
    assert abs(m["sampled_reward"] - 1 / k) <= 0.2, m  # 48 episodes: ~3 sigma


def test_warm_start_is_cached_and_the_verb_reports_it() -> None:
    first = warm_model(seed=0)
    assert warm_model(seed=0) == first
    out = subprocess.run([sys.executable, "-m", "hpc.cli", "warm-start", "--measure", "0"], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout)["dir"] == str(first)
    exact = expected_reward(first, 1.0)
    assert abs(exact["expected_reward"] - 1 / len(VALUES)) <= 0.05
