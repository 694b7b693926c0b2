"""A claim is parsed once at claim time, and what the spool deduplicates by comes from its lease."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from hpc.spool import Spool, TaskLease
from hpc.trajectory import Status
from rollout_node.pipeline.claim import read_claim
from rollout_node.pipeline.episode import Episode, Group
from rollout_node.tasks.instance import TaskInstance


def _lease(tmp_path: Path, record: dict[str, Any], reclaims: int = 0) -> TaskLease:
    spool = Spool(tmp_path)
    spool.put_tasks([record])
    lease = spool.claim_task("w")
    for _ in range(reclaims):  # each release bumps the attempt, as a reclaim after an expired lease does
        assert lease is not None and spool.release_task(lease)
        lease = spool.claim_task("w")
    assert lease is not None
    return lease


def test_a_claim_is_parsed_once_and_its_trajectories_carry_the_lease_attempt(tmp_path: Path) -> None:
    lease = _lease(tmp_path, {"task_id": "t1", "instance_id": "i1", "policy_version": 7, "group_size": 3}, reclaims=2)
    parsed: list[Mapping[str, Any]] = []

    def parse(record: Mapping[str, Any]) -> TaskInstance:
        parsed.append(record)
        return TaskInstance(instance_id="i1", repo="r", base_commit="c", patch="p", test_patch="t",
                            FAIL_TO_PASS=("test_a",), PASS_TO_PASS=())

    claim = read_claim(lease, parse)
    assert claim.task is not None and claim.error == "" and claim.record.group_size == 3
    group = Group(claim=claim, size=3, image="")
    trajectories = [Episode(group, i, 0, seed=i).trajectory(Status.NODE_ERROR, None) for i in range(3)]
    assert len(parsed) == 1  # building every trajectory read the typed claim, never the record again
    assert {t.attempt for t in trajectories} == {2} and lease.attempt == 2
    assert {t.task_version for t in trajectories} == {7} and group.task is claim.task


def test_a_malformed_record_is_a_claim_without_a_task(tmp_path: Path) -> None:
    lease = _lease(tmp_path, {"task_id": "t2", "group_size": "many"}, reclaims=1)

    def parse(record: Mapping[str, Any]) -> TaskInstance:
        raise AssertionError("a record that does not read is never parsed into a task")

    claim = read_claim(lease, parse)
    assert claim.task is None and "malformed task" in claim.error and "group_size" in claim.error
    group = Group(claim=claim, size=2, image="")
    traj = Episode(group, 0, 0, seed=0).trajectory(Status.NODE_ERROR, None)
    assert (traj.task_id, traj.attempt, traj.task_version) == ("t2", 1, -1)
    with pytest.raises(RuntimeError, match="malformed"):  # its group has no task to stage
        _ = group.task


def test_a_task_that_does_not_parse_keeps_its_record(tmp_path: Path) -> None:
    lease = _lease(tmp_path, {"task_id": "t3", "group_size": 4, "instance_id": "missing"})

    def parse(record: Mapping[str, Any]) -> TaskInstance:
        raise ValueError("instance_id 'missing' is not in tasks.source")

    claim = read_claim(lease, parse)
    assert claim.task is None and "not in tasks.source" in claim.error and claim.record.group_size == 4
