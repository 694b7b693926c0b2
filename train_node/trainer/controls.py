"""Bench-only controls of the step: switches that make a run a control arm, never used to train a policy.

Guarantees:
- ``algorithm.control_shuffle_rewards`` (:func:`shuffle_rewards`): before a batch is trained its
  rewards are permuted across every episode of the step (a seeded permutation per step), and the
  advantages recomputed from them with the run's ``algorithm.advantage_norm``; the tokens, masks,
  behaviour logprobs and group sizes stay as sampled. A policy trained on them gets the same amount of
  gradient as a real run but none of the information about which episode earned the reward
  (``scripts/bench_learning_real.py``'s shuffled arm). The trajectories keep their real rewards, so the
  logged reward is what the policy actually earned.
"""

from __future__ import annotations

import dataclasses
import random

from train_node.trainer.consumer import Batch
from train_node.trainer.loss import step_advantages


def shuffle_rewards(batch: Batch, advantage_norm: str, rng: random.Random) -> None:
    """Replace the advantages of ``batch``'s samples by those of its rewards, permuted across the step."""
    rewards = [float(t.reward or 0.0) for g in batch.groups for t in g]
    rng.shuffle(rewards)
    groups, start = [], 0
    for g in batch.groups:
        groups.append(rewards[start:start + len(g)])
        start += len(g)
    advantages = [a for g in step_advantages(groups, advantage_norm) for a in g]
    assert len(advantages) == len(batch.samples), "a batch lists its samples group by group"
    batch.samples = [dataclasses.replace(s, advantage=a) for s, a in zip(batch.samples, advantages, strict=True)]


def step_rng(seed: int, step: int) -> random.Random:
    """The permutation's generator for one step: the same run seed and step give the same permutation."""
    return random.Random(seed * 1_000_003 + step)
