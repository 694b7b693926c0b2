"""``algorithm.control_shuffle_rewards``: the bench's control arm permutes a step's rewards across its episodes."""

from __future__ import annotations

import numpy as np
import pytest

from train_node.trainer.consumer import Batch
from train_node.trainer.controls import shuffle_rewards, step_rng
from train_node.trainer.packing import Sample

from .helpers import make_group


def _batch() -> Batch:
    rng = np.random.default_rng(3)
    groups = [make_group(f"t{i}", rewards, rng) for i, rewards in
              enumerate(([1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]))]
    samples = [Sample(t.trajectory_id, t.token_ids, t.loss_mask, t.logprobs, 0.0) for g in groups for t in g]
    return Batch(samples=samples, groups=groups, staleness=[0] * 12, policy_version=0)


def test_advantages_come_from_a_seeded_permutation_of_the_steps_rewards() -> None:
    real = _batch().rewards
    permuted = []
    for step in (1, 2):
        batch = _batch()
        shuffle_rewards(batch, "batch_mean", step_rng(0, step))
        mean = sum(real) / len(real)
        got = [s.advantage + mean for s in batch.samples]  # batch_mean: advantage = reward - step mean
        assert sorted(got) == pytest.approx(sorted(real))
        assert batch.rewards == real, "the trajectories keep their real rewards (what the run logs)"
        assert [s.trajectory_id for s in batch.samples] == [t.trajectory_id for g in batch.groups for t in g]
        again = _batch()
        shuffle_rewards(again, "batch_mean", step_rng(0, step))
        assert [s.advantage for s in again.samples] == [s.advantage for s in batch.samples]
        permuted.append(got)
    assert any(g != pytest.approx(real) for g in permuted), "a permutation that never moves a reward is no control"
    assert permuted[0] != pytest.approx(permuted[1])
