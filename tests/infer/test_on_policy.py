"""One distribution end to end: tokens sampled by the real CPU engine at T = 0.7 through the real
inference client, trained by the real DeepSpeed trainer on the same weights, have importance ratio 1.

The negative control records the same samples as if drawn at T = 1 (what the trainer scored before
the logprob fix, in effect): the ratio then deviates by orders of magnitude, so the check can fail.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hpc.trajectory import Trajectory
from rollout_node.agent.client import InferenceClient
from rollout_node.agent.policy import SamplingParams
from tests.infer.infer_helpers import first_train_step

pytestmark = pytest.mark.deepspeed
T = 0.7
PROMPTS = [[1, 105, 230, 377, 1024], [1, 17, 99, 3000, 2048, 5], [1, 42, 43, 44], [1, 7, 8, 9, 10, 11, 12]]


def _samples(url: str, recorded_temperature: float) -> list[list[Trajectory]]:
    client = InferenceClient([url], seed=0)
    groups = []
    for g, prompt in enumerate(PROMPTS):
        group = []
        for i in range(2):
            c = client.session(f"task{g}").generate(prompt, SamplingParams(max_tokens=24, temperature=T, seed=10 * g + i))
            assert c.logprob_kind == "processed" and set(c.versions) == {0}
            n = len(prompt) + len(c.token_ids)
            mask = np.r_[np.zeros(len(prompt)), np.ones(len(c.token_ids))].astype(np.int8)
            group.append(Trajectory(
                trajectory_id=f"task{g}/{i}", task_id=f"task{g}", group_id=f"task{g}", sample_index=i,
                token_ids=np.r_[prompt, c.token_ids].astype(np.int32), loss_mask=mask,
                logprobs=np.r_[np.zeros(len(prompt)), c.logprobs].astype(np.float32),
                policy_versions=np.where(mask == 1, 0, -1).astype(np.int32), reward=float(i),
                logprob_kind=c.logprob_kind, sampling={"temperature": recorded_temperature}))
            assert group[-1].num_tokens == n
        groups.append(group)
    client.close()
    return groups


def _first_step(tmp: Path, name: str, recorded_temperature: float) -> dict:
    return first_train_step(tmp, name, lambda url, _model: _samples(url, recorded_temperature))


def test_on_policy_ratio_is_one_at_temperature_07(tmp_path: Path) -> None:
    step = _first_step(tmp_path, "run", T)
    assert step["samples"] == 8 and step["by_staleness"]["0"]["tokens"] == step["loss_tokens"] > 0
    print(f"on-policy ratio_dev at T={T}: {step['ratio_dev']:.2e}")
    assert step["ratio_dev"] < 1e-4, step
    assert step["truncated_fraction"] == 0.0 and np.isfinite(step["grad_norm"])
    # the control: the same engine's samples, scored as if drawn at T = 1
    wrong = _first_step(tmp_path, "control", 1.0)
    print(f"control (scored at T=1) ratio_dev: {wrong['ratio_dev']:.3f}")
    assert wrong["ratio_dev"] > 1e-2, wrong
