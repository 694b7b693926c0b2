"""The sampling seed of one sample attempt: a function of (run seed, task id, sample index, attempt).

Defined once, by the agent loop (:func:`rollout_node.agent.seeds.sampling_seed`, which also takes
the turn); the pipeline's episode seed is that function at turn 0, and the agent loop derives the
seed of each later turn from the same four inputs. Reruns of a sample therefore reproduce; a
retry (``attempt + 1``) samples differently.
"""

from __future__ import annotations

from rollout_node.agent.seeds import sampling_seed


def episode_seed(run_seed: int, task_id: str, sample_index: int, attempt: int) -> int:
    """The seed the pipeline records for one sample attempt (turn 0 of the agent's seeds)."""
    return sampling_seed(run_seed, task_id, sample_index, attempt, 0)
