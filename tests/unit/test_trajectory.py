"""The trajectory record validates its arrays and defines staleness once."""

from __future__ import annotations

import numpy as np
import pytest

from hpc.trajectory import Status, Trajectory, staleness


def make(**over: object) -> Trajectory:
    base: dict = dict(trajectory_id="t0", task_id="task", group_id="g", sample_index=0,
                      token_ids=[1, 2, 3, 4], loss_mask=[0, 0, 1, 1], logprobs=[0, 0, -0.5, -1.0],
                      policy_versions=[-1, -1, 3, 2], reward=1.0)
    base.update(over)
    return Trajectory(**base)


def test_arrays_are_typed_and_frozen() -> None:
    t = make()
    assert t.token_ids.dtype == np.int32 and t.logprobs.dtype == np.float32
    with pytest.raises(ValueError):
        t.token_ids[0] = 5
    assert t.num_generated == 2 and t.trainable


@pytest.mark.parametrize("over, msg", [
    (dict(loss_mask=[0, 1, 1]), "length"),
    (dict(loss_mask=[0, 2, 1, 1]), "0 or 1"),
    (dict(logprobs=[0.1, 0, -0.5, -1.0]), "0 where loss_mask is 0"),
    (dict(logprobs=[0, 0, 0.5, -1.0]), "<= 0"),
    (dict(policy_versions=[0, -1, 3, 2]), "-1 where loss_mask is 0"),
    (dict(policy_versions=[-1, -1, -1, 2]), ">= 0 where it is 1"),
    (dict(token_ids=[[1, 2], [3, 4]]), "1-D"),
    (dict(token_ids=[-1, 2, 3, 4]), ">= 0"),
    (dict(task_id=""), "non-empty"),
    (dict(reward=float("nan")), "finite"),
])
def test_invalid_records_are_refused(over: dict, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        make(**over)


def test_status_semantics() -> None:
    assert Status("ok").trainable and not Status("ok").infrastructure
    assert Status("sandbox_error").infrastructure and not Status("sandbox_error").trainable
    assert not Status("cancelled").trainable and not Status("cancelled").infrastructure
    assert not make(status="inference_error").trainable
    with pytest.raises(ValueError):
        make(status="exploded")


def test_staleness_is_trainer_version_minus_oldest_generated_token() -> None:
    assert make().staleness(5) == 3
    assert staleness(5, [-1, -1]) == 0


def test_json_round_trip() -> None:
    t = make(timings={"run_s": 1.5}, sampling={"temperature": 1.0}, attempt=1)
    back = Trajectory.from_json(t.to_json())
    assert back.to_json() == t.to_json()
